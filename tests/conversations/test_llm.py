"""``handler = "llm"`` against the fake OpenAI-compatible provider and the platform fakes,
with the real bot libraries, real Redis and PostgreSQL: the model's reply streams into one
message on Telegram, Slack and Mattermost and ends as exactly its text; the conversation is
sent trimmed to ``history_tokens`` after the system prompt; a failing chain ends in the
apology (after the words shown, when a provider fails mid-stream); over budget, the bot says
so and calls no model."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gateway.config import ConfigError, Settings
from gateway.conversations.llm import OVER_BUDGET, LlmHandler, trim
from gateway.conversations.service import APOLOGY
from gateway.conversations.store import Message
from gateway.stores.runtime import Runtime
from tests.conversations.platforms import (
    INBOX_FAST,
    Chat,
    assert_grew_in_one_message,
    bot_replies,
    limits,
)
from tests.fakes.openai import FakeOpenAI, dead_port, provider_tables, split_reply
from tests.fakes.pytest_plugin import OPENAI_KEY
from tests.helpers import wait_until

PER_SECOND = 2  # the chat's platform limit here: one call per 0.5 s
STORY = ("Once upon a time a small gateway carried messages between chats and models, "
         "and every word it was given arrived in order, exactly once, never twice.")
SYSTEM = "You are brief."


@pytest.fixture(autouse=True)
def provider_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_OPENAI_KEY", OPENAI_KEY)


def sections(*providers: tuple[str, FakeOpenAI | str], budgets: dict[str, int] | None = None,
             **conversations: Any) -> dict[str, Any]:
    return {"providers": provider_tables(*providers),
            "budgets": budgets or {},
            "conversations": {"handler": "llm", "providers": [n for n, _ in providers],
                              "model": "fake-model", "system_prompt": SYSTEM,
                              "edit_interval": 0.05, "typing_interval": 0.2, **conversations},
            "ratelimit": limits(PER_SECOND), "inbox": INBOX_FAST,
            # The conversation alone, as before answers from the documents (test_answers).
            "answers": {"retrieve": False}}


@pytest.mark.parametrize("chat", ["telegram", "slack", "mattermost"], indirect=True)
async def test_the_models_reply_streams_into_one_message_and_ends_as_its_text(
        chat: Chat, fake_openai: FakeOpenAI, runtime: Runtime) -> None:
    fake_openai.reply = STORY
    fake_openai.chunk_delay = 0.05  # ~1.3 s of words
    fake_openai.slow("chat", 0.6)  # the typing indicator shows while the model thinks
    await chat.start(sections(("a", fake_openai)))
    await chat.say("tell me a story")
    await chat.wait_for_text(STORY)
    assert_grew_in_one_message(chat, STORY, PER_SECOND)
    first_post = chat.replies()[0].time
    typing = chat.typing()
    if chat.name == "slack":
        assert typing == []  # no indicator exists for bots
    else:
        assert typing and all(call.time < first_post for call in typing)
    [call] = fake_openai.calls_to("chat")
    assert call.params["model"] == "fake-model" and call.params["stream"] is True
    assert call.params["messages"] == [{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": "tell me a story"}]
    await wait_until(lambda: bot_replies(runtime), message="reply stored")
    assert await bot_replies(runtime) == [STORY]  # the whole text, stored once


@pytest.mark.parametrize("chat", ["telegram"], indirect=True)
async def test_the_conversation_is_sent_trimmed_to_history_tokens(
        chat: Chat, fake_openai: FakeOpenAI) -> None:
    # Estimates (4 characters a token, 4 more a message): the first message 10 + 4, its
    # echoed reply 12 + 4, the second 2 + 4: the newest two fit 30 tokens, all three do not.
    first, second = "a" * 40, "b" * 8
    await chat.start(sections(("a", fake_openai), history_tokens=30))
    await chat.say(first)
    await chat.wait_for_text(f"echo: {first}")
    await chat.say(second)
    await chat.wait_for_text(f"echo: {second}")
    sent = fake_openai.calls_to("chat")[-1].params["messages"]
    assert sent == [{"role": "system", "content": SYSTEM},
                    {"role": "assistant", "content": f"echo: {first}"},
                    {"role": "user", "content": second}]


@pytest.mark.parametrize("chat", ["telegram"], indirect=True)
async def test_a_failing_chain_ends_in_the_apology(chat: Chat, fake_openai: FakeOpenAI,
                                                   runtime: Runtime) -> None:
    fake_openai.fail("chat", 500, times=10)
    dead = f"http://127.0.0.1:{dead_port()}/v1"
    await chat.start(sections(("a", fake_openai), ("b", dead)))
    await chat.say("anyone there?")
    await chat.wait_for_text(APOLOGY)
    assert chat.shown() == [[APOLOGY]]
    assert len(fake_openai.calls_to("chat")) == 1  # then the dead port, then the apology
    assert chat.typing()  # the chat saw the bot at work, then the apology, never silence
    await wait_until(lambda: bot_replies(runtime), message="reply stored")
    assert await bot_replies(runtime) == [APOLOGY]


@pytest.mark.parametrize("chat", ["telegram"], indirect=True)
async def test_a_provider_failing_after_its_first_words_ends_in_them_and_the_apology(
        chat: Chat, fake_openai: FakeOpenAI, runtime: Runtime) -> None:
    fake_openai.reply = STORY
    fake_openai.break_stream(after=3)  # then the connection drops: no fallback after words
    await chat.start(sections(("a", fake_openai), ("b", fake_openai)))
    await chat.say("tell me a story")
    ending = f"{''.join(split_reply(STORY)[:3]).rstrip()}\n\n{APOLOGY}"
    await chat.wait_for_text(ending)
    assert len(chat.shown()) == 1 and len(fake_openai.calls_to("chat")) == 1
    await wait_until(lambda: bot_replies(runtime), message="reply stored")
    assert await bot_replies(runtime) == [ending]


@pytest.mark.parametrize("chat", ["telegram"], indirect=True)
async def test_over_budget_the_bot_says_so_and_calls_no_model(
        chat: Chat, fake_openai: FakeOpenAI, runtime: Runtime) -> None:
    await chat.start(sections(("a", fake_openai), budgets={"daily_tokens_per_chat": 5}))
    await chat.say("one two three four five six")  # under budget: answered, its usage kept
    await chat.wait_for_text("echo: one two three four five six")
    await chat.say("and again")
    await chat.wait_for_text(OVER_BUDGET["chat"])
    assert len(fake_openai.calls_to("chat")) == 1  # the second message called nothing
    assert [texts[-1] for texts in chat.shown()] == ["echo: one two three four five six",
                                                   OVER_BUDGET["chat"]]
    used = await runtime.pg.fetchval(
        "SELECT sum(tokens_in + tokens_out) FROM provider_usage WHERE chat_key = $1",
        "telegram:777")
    assert used >= 5


@pytest.mark.parametrize("chat", ["slack", "mattermost"], indirect=True)
async def test_a_new_thread_is_no_new_chat_budget(
        chat: Chat, fake_openai: FakeOpenAI, runtime: Runtime) -> None:
    """A thread is a conversation of its own, not a chat of its own: the channel's budget
    spent, a message in a new thread is over it too."""
    await chat.start(sections(("a", fake_openai), budgets={"daily_tokens_per_chat": 5}))
    await chat.say("one two three four five six")
    await chat.wait_for_text("echo: one two three four five six")
    await chat.say("and again, in a thread", thread="1700000000.000100")
    await chat.wait_for_text(OVER_BUDGET["chat"])
    assert len(fake_openai.calls_to("chat")) == 1  # the thread's message called nothing


def test_history_is_trimmed_newest_first() -> None:
    def message(seq: int, text: str) -> Message:
        return Message(1, seq, "user", text, None, None)

    history = [message(1, "x" * 400), message(2, "y" * 8), message(3, "z" * 8)]
    assert [m.seq for m in trim(history, 12)] == [2, 3]  # 6 + 6 tokens
    assert [m.seq for m in trim(history, 11)] == [3]
    assert [m.seq for m in trim(history[:1], 1)] == [1]  # the newest always goes


def test_llm_configuration_is_checked(settings: Settings, fake_openai: FakeOpenAI) -> None:
    def configured(**conversations: Any) -> Settings:
        tables = sections(("a", fake_openai))
        tables["conversations"] = {"handler": "llm", **conversations}
        return dataclasses.replace(settings, sections=tables)

    handler = LlmHandler(configured(providers=["a"], model="m"))
    assert handler.names == ["a"] and handler.history_tokens == 2000
    assert handler.system_prompt is None
    for bad in ({"model": "m"}, {"providers": [], "model": "m"},
                {"providers": ["nowhere"], "model": "m"}, {"providers": ["a"]},
                {"providers": ["a"], "model": "m", "history_tokens": 0},
                {"providers": ["a"], "model": "m", "system_prompt": 3}):
        with pytest.raises(ConfigError):
            LlmHandler(configured(**bad))
