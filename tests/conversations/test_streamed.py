"""Streamed replies on Telegram, Slack and Mattermost, against their fakes with the real bot
libraries, real Redis and PostgreSQL: typing until the first words, one message edited as the
text grows, under the chat's limit, never to the same text, ending in exactly the whole text
(stored once); a failing stream ends in the apology; a reply interrupted mid-stream and
retried by the next holder ends in the same message."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.config import Settings
from gateway.conversations.service import APOLOGY, ConversationService, Incoming
from gateway.stores.runtime import Runtime, open_runtime
from tests.conversations import scripted
from tests.conversations.fast import with_sections
from tests.conversations.platforms import (
    INBOX_FAST,
    Chat,
    TelegramChat,
    bot_replies,
    chat_on,
    gaps,
    limits,
)
from tests.fakes import FakeMattermost, FakeSlack, FakeTelegram
from tests.helpers import wait_until

PER_SECOND = 2  # the chat's limit in these tests: one platform call per 0.5 s
SLACK_PER_SECOND = 2


def sections(**conversations: Any) -> dict[str, Any]:
    return {"conversations": {"handler": "tests.conversations.scripted:handler",
                              "edit_interval": 0.05, "typing_interval": 0.2, **conversations},
            "ratelimit": limits(PER_SECOND), "inbox": INBOX_FAST}


@pytest.fixture
def script() -> scripted.Script:
    scripted.SCRIPT = scripted.Script()
    return scripted.SCRIPT


@pytest.fixture
async def chat(request: pytest.FixtureRequest, runtime: Runtime, settings: Settings,
               make_client: Callable[..., Any], fake_telegram: FakeTelegram,
               fake_slack: FakeSlack, fake_mattermost: FakeMattermost) -> AsyncIterator[Chat]:
    """The chat of ``request.param`` (the fakes are cheap: all three start)."""
    fakes = {"telegram": fake_telegram, "slack": fake_slack, "mattermost": fake_mattermost}
    async with chat_on(request.param, settings, fakes[request.param], make_client) as opened:
        yield opened


def assert_grew_in_one_message(chat: Chat, full: str) -> list[str]:
    """The chat shows one bot message, posted with the first words and edited as the text
    grew (each text a longer start of the whole, never the same twice) to exactly ``full``,
    every platform call at least the chat limit's spacing after the one before."""
    [texts] = chat.shown()
    assert texts[-1] == full
    assert len(texts) >= 3, texts  # the first words, at least one edit, the whole text
    assert all(full.startswith(text) for text in texts)
    assert all(len(a) < len(b) for a, b in itertools.pairwise(texts))
    calls = chat.replies()
    assert len(calls) == len(texts)  # no edit was refused (none to the same text)
    assert min(gaps(calls)) >= 1 / PER_SECOND - 0.05, gaps(calls)
    return texts


@pytest.mark.parametrize("chat", ["telegram", "slack", "mattermost"], indirect=True)
async def test_a_streamed_reply_grows_in_one_message_to_the_whole_text(
        chat: Chat, script: scripted.Script, runtime: Runtime) -> None:
    script.first_after = 0.6  # long enough for the typing indicator to show
    await chat.start(sections())
    await chat.say("tell me a story")
    await chat.wait_for_text(script.text)
    assert_grew_in_one_message(chat, script.text)
    first_post = chat.replies()[0].time
    typing = chat.typing()
    if chat.name == "slack":
        assert typing == []  # no indicator exists for bots
    else:
        assert typing and all(call.time < first_post for call in typing)
    await wait_until(lambda: bot_replies(runtime), message="reply stored")
    assert await bot_replies(runtime) == [script.text]  # the whole text, stored once


@pytest.mark.parametrize("chat", ["telegram"], indirect=True)
@pytest.mark.parametrize("fail_after", [0, 8])
async def test_a_failing_stream_ends_in_what_was_written_and_the_apology(
        chat: Chat, script: scripted.Script, runtime: Runtime, fail_after: int) -> None:
    script.fail_after = fail_after
    await chat.start(sections())
    await chat.say("go")
    written = "".join(script.deltas[:fail_after]).rstrip()
    ending = f"{written}\n\n{APOLOGY}" if written else APOLOGY
    await chat.wait_for_text(ending)
    assert len(chat.shown()) == 1
    if not written:
        assert chat.shown() == [[APOLOGY]]  # nothing before it: no message until then
    await wait_until(lambda: bot_replies(runtime), message="reply stored")
    assert await bot_replies(runtime) == [ending]


async def test_a_reply_interrupted_midway_is_finished_in_the_same_message(
        runtime: Runtime, settings: Settings, fake_telegram: FakeTelegram,
        make_client: Callable[..., Any], script: scripted.Script) -> None:
    """The holder stops mid-stream (its chat is taken from it and given back); the next
    holder runs the handler again and edits the message the first one posted, found through
    the id the fence recorded, instead of posting a second one."""
    script.stall_after = 6
    first = TelegramChat(settings, fake_telegram, make_client)
    await first.start(sections())
    await first.say("story please")
    await wait_until(lambda: script.stalled.is_set() and first.shown(),
                     message="first holder shows part of the reply")
    await first.stop()  # drains, cancels the stalled reply, gives the chat back
    partial = first.shown()[0][-1]
    assert script.text.startswith(partial) and partial != script.text
    second = TelegramChat(settings, fake_telegram, make_client)
    try:
        await second.start(sections())
        await second.wait_for_text(script.text)
    finally:
        await second.stop()
    [texts] = fake_telegram.shown(TelegramChat.chat_id)  # one message, first to last
    assert texts[-1] == script.text and partial in texts
    assert len(fake_telegram.sent_messages(TelegramChat.chat_id)) == 1
    assert script.runs == 2
    assert await bot_replies(runtime) == [script.text]


async def test_a_plain_send_gets_the_whole_stream_at_once(
        runtime: Runtime, settings: Settings, script: scripted.Script) -> None:
    """A caller that hands a plain function (not a live reply) gets one call, the whole
    text."""
    rt = await open_runtime(with_sections(settings, **sections()))
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    try:
        await ConversationService(rt).handle(
            Incoming(platform="mattermost", chat="c", thread=None, user_id="u",
                     user_name="u", text="hi", message_id="m1"), send)
    finally:
        await rt.close()
    assert sent == [script.text]
