"""Streamed replies from a scripted handler (test_llm.py has the model's, on every platform),
against the Telegram fake with the real bot library, real Redis and PostgreSQL: a stream that
fails ends in what was written and the apology; a reply interrupted mid-stream and retried by
the next holder ends in the same message (and a retry that lost the message id finds it on
Slack and Mattermost); a reply longer than a message goes on in the next; a caller without a
live reply gets the whole text once."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web

from gateway.config import Secret, Settings
from gateway.conversations.service import APOLOGY, ConversationService, Incoming
from gateway.inbound.chat_guard import Guard
from gateway.inbound.mattermost.component import CREATED_AT, POST_ID, MattermostBot
from gateway.inbound.slack import SlackBot, SlackReply
from gateway.inbox.entry import Entry
from gateway.outbound.live import pieces
from gateway.stores.runtime import Runtime, open_runtime
from tests.conversations import scripted
from tests.conversations.fast import with_sections
from tests.conversations.platforms import INBOX_FAST, Chat, TelegramChat, bot_replies, limits
from tests.fakes import FakeMattermost, FakeSlack, FakeTelegram
from tests.fakes.mattermost import HUMAN_USER_ID
from tests.fakes.pytest_plugin import SLACK_TOKEN
from tests.fakes.slack import CHANNEL_ID
from tests.helpers import wait_until
from tests.inbound.mattermost.helpers import mattermost_settings


def sections(**conversations: Any) -> dict[str, Any]:
    return {"conversations": {"handler": "tests.conversations.scripted:handler",
                              "edit_interval": 0.05, "typing_interval": 0.2, **conversations},
            "ratelimit": limits(2), "inbox": INBOX_FAST}


@pytest.fixture
def script() -> scripted.Script:
    scripted.SCRIPT = scripted.Script()
    return scripted.SCRIPT


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


@pytest.mark.parametrize("chat", ["telegram"], indirect=True)
async def test_a_reply_longer_than_a_message_goes_on_in_the_next(
        chat: Chat, script: scripted.Script, runtime: Runtime) -> None:
    """Telegram holds 4096 characters a message: 6,000 go in two, cut after a space, each
    posted once and then only edited; together they show exactly the whole text."""
    script.deltas = [f"{i:02d}" + "x" * 97 + " " for i in range(60)]
    script.every = 0.02
    await chat.start(sections())
    await chat.say("a long one please")
    tail = pieces(script.text, 4096)[-1]
    await chat.wait_for_text(tail)
    first, second = chat.shown()  # two messages, no third
    assert first[-1] + second[-1] == script.text
    assert len(first[-1]) <= 4096 and first[-1].endswith(" ")
    assert all(len(text) <= 4096 for texts in chat.shown() for text in texts)
    assert len(chat.replies()) == len(first) + len(second)  # no edit refused
    await wait_until(lambda: bot_replies(runtime), message="reply stored")
    assert await bot_replies(runtime) == [script.text]


def test_pieces_are_cut_after_a_newline_else_a_space_else_at_the_limit() -> None:
    assert pieces("short", 10) == ["short"]
    assert pieces("aaaa bbbb\ncc dd", 10) == ["aaaa bbbb\n", "cc dd"]
    assert pieces("aaa bbb ccc ddd", 10) == ["aaa bbb ", "ccc ddd"]
    assert pieces("a" * 25, 10) == ["a" * 10, "a" * 10, "a" * 5]
    assert pieces("a bbbbbbbbbbbb", 10) == ["a bbbbbbbb", "bbbb"]  # no space in 2nd half
    text = " ".join(f"w{i}" for i in range(200))
    grown = [pieces(text[:n], 50) for n in range(len(text) + 1)]
    for before, after in itertools.pairwise(grown):  # earlier pieces never change
        assert after[:len(before) - 1] == before[:-1]
        assert "".join(after) == "".join(before) + text[len("".join(before))]


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


async def test_a_retried_mattermost_reply_edits_the_post_the_platform_shows(
        runtime: Runtime, settings: Settings, fake_mattermost: FakeMattermost) -> None:
    """The window a kill -9 can leave (posted, the id never recorded): the retried holder
    finds its earlier post by the props naming the message, and edits it."""
    rt = await open_runtime(mattermost_settings(settings, fake_mattermost.url))
    try:
        bot = MattermostBot(rt)
        question = fake_mattermost.make_post("general", "question")
        entry = Entry(Incoming(platform="mattermost", chat="general", thread=None,
                               user_id=HUMAN_USER_ID, user_name="alice", text="question",
                               message_id=question["id"]),
                      {POST_ID: question["id"], CREATED_AT: str(question["create_at"])})
        async with bot.session():
            first = await bot._sender(entry, False).post("Once upon")  # type: ignore[attr-defined]
            again = await bot._sender(entry, True).post("Once upon a time")  # type: ignore[attr-defined]
    finally:
        await rt.close()
    assert again == first
    assert fake_mattermost.shown("general") == [["Once upon", "Once upon a time"]]


async def test_a_retried_slack_reply_edits_the_message_the_channel_shows(
        runtime: Runtime, settings: Settings, fake_slack: FakeSlack) -> None:
    """As above on Slack: the earlier reply is found by its metadata, and edited."""
    rt = await open_runtime(dataclasses.replace(
        settings, slack_bot_token=Secret(SLACK_TOKEN), slack_signing_secret=Secret("s"),
        slack_api_url=fake_slack.api_url))
    try:
        bot = SlackBot(rt, Guard(web.Application(), rt))
        question = fake_slack.add_message(CHANNEL_ID, "question")
        incoming = Incoming(platform="slack", chat=CHANNEL_ID, thread=None, user_id="U1",
                            user_name=None, text="question", message_id=question["ts"],
                            team="T0FAKE")
        first = await SlackReply(bot, incoming, retried=False).post("Once upon")
        again = await SlackReply(bot, incoming, retried=True).post("Once upon a time")
        same = await SlackReply(bot, incoming, retried=True).post("Once upon a time")
    finally:
        await rt.close()
    assert again == first == same
    assert fake_slack.shown(CHANNEL_ID) == [["Once upon", "Once upon a time"]]  # no 3rd edit
