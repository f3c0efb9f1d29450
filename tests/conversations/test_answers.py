"""Answers with sources (issue 27, points 3 and 4): with ``handler = "llm"`` the question is
searched among the documents the chat may read (its linked accounts' and ``[answers]
shared``) through the same owner filter as ``GET /v1/search``; the chunks go into the prompt
as numbered sources; the reply ends with the sources the model cited; nothing found, it says
no document matched; ``/sources`` repeats them. Documents written by the default stage
handlers, the model a local fake, the chat a fake Telegram, stores real."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway import keys
from gateway.config import ConfigError, Settings
from gateway.conversations import answers
from gateway.stores.runtime import Runtime, open_runtime
from tests.conversations.direct import llm_reply
from tests.conversations.platforms import INBOX_FAST, Chat, limits
from tests.fakes.openai import FakeOpenAI, provider_tables
from tests.fakes.pytest_plugin import OPENAI_KEY
from tests.knowledge.indexing import index_many

ALICE, BOB = keys.owner_namespace("alice"), keys.owner_namespace("bob")
VALVES_A = ("The Brindlecast plant buys its steam valves from Quorvane Industries; the "
            "contract reference is QV-7781 and Selma Ardu approves every order.")
PUMPS_A = ("Cooling pumps at the Brindlecast plant are serviced by Tavrel Works every "
           "spring; the maintenance log lives under TW-3302.")
VALVES_B = ("Bob's plant buys its steam valves from Hexmoor Supply under contract HX-5520; "
            "payment goes to IBAN DE89 3704 0044 0532 0130 00.")
HANDBOOK = "Holidays: every employee has 28 days of paid leave a year, booked in Kestrel HR."
SYSTEM = "You are brief."


@pytest.fixture(autouse=True)
def provider_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_OPENAI_KEY", OPENAI_KEY)


@pytest.fixture
async def documents(runtime: Runtime) -> None:
    """Alice's two documents, Bob's one, and the handbook (a webhook source's)."""
    await index_many(runtime, [
        (f"{ALICE}/valves", {"text": VALVES_A, "title": "Valve supplier"}),
        (f"{ALICE}/pumps", {"text": PUMPS_A, "url": "https://wiki.example/pumps"}),
        (f"{BOB}/valves", {"text": VALVES_B, "title": "Bob's valves"}),
        ("webhook:handbook:h1", {"text": HANDBOOK, "title": "Staff handbook"}),
    ])
    await runtime.pg.execute("ANALYZE pipeline_chunks")


def sections(fake: FakeOpenAI, **answer_settings: Any) -> dict[str, Any]:
    return {"providers": provider_tables(("a", fake)),
            "conversations": {"handler": "llm", "providers": ["a"], "model": "m",
                              "system_prompt": SYSTEM, "edit_interval": 0.05},
            "answers": answer_settings, "ratelimit": limits(2), "inbox": INBOX_FAST}


@pytest.fixture
async def llm(runtime: Runtime, fake_openai: FakeOpenAI) -> AsyncIterator[Any]:
    """``await llm(**[answers])`` → a runtime whose LlmHandler answers a Telegram chat."""
    opened: list[Runtime] = []

    async def start(**answer_settings: Any) -> Runtime:
        rt = await open_runtime(dataclasses.replace(
            runtime.settings, sections=sections(fake_openai, **answer_settings)))
        opened.append(rt)
        return rt

    yield start
    for rt in opened:
        await rt.close()


async def _link(runtime: Runtime, sub: str, chat: str = "777") -> None:
    await runtime.pg.execute("INSERT INTO chat_links (sub, platform, chat_key)"
                             " VALUES ($1, 'telegram', $2)", sub, chat)


async def _ask(rt: Runtime, text: str, chat: str = "777") -> str:
    return await llm_reply(rt, chat, text)


def _system(fake: FakeOpenAI) -> str:
    return str(fake.calls_to("chat")[-1].params["messages"][0]["content"])


async def test_a_linked_chats_prompt_holds_its_accounts_document_never_anothers(
        llm: Any, fake_openai: FakeOpenAI, runtime: Runtime, documents: None) -> None:
    rt = await llm()
    await _link(runtime, "alice")
    fake_openai.reply = "Quorvane Industries supplies them [1]."
    reply = await _ask(rt, "Who supplies the steam valves?")
    prompt = _system(fake_openai)
    assert prompt.startswith(SYSTEM) and answers.INSTRUCTIONS in prompt
    assert "[1] Valve supplier\n" + VALVES_A in prompt
    assert "Hexmoor" not in prompt and "DE89" not in prompt  # Bob's, never
    assert reply == ("Quorvane Industries supplies them [1].\n\nSources:\n"
                     "[1] Valve supplier")
    # Asked for Bob's own words, Alice's chat still finds nothing of his.
    fake_openai.reply = "I do not know."
    reply = await _ask(rt, "Which contract is HX-5520, paid to IBAN DE89?")
    assert "Hexmoor" not in _system(fake_openai) and "DE89 3704" not in _system(fake_openai)
    assert "HX-5520" not in reply.split("\n\n", 1)[-1]
    # A question none of its documents answer (no word of it in them, far in meaning).
    fake_openai.reply = "Lima."
    assert await _ask(rt, "What is the capital of Peru?") == f"Lima.\n\n{answers.NO_MATCH}"
    assert _system(fake_openai) == SYSTEM


async def test_a_model_that_cites_2_gets_source_2_under_the_reply(
        llm: Any, fake_openai: FakeOpenAI, runtime: Runtime, documents: None) -> None:
    rt = await llm()
    await _link(runtime, "alice")
    fake_openai.reply = "The second source says so [2]."
    reply = await _ask(rt, "Who services the Brindlecast pumps and buys the valves?")
    prompt = _system(fake_openai)
    numbered = {line[:3]: line for line in prompt.splitlines()
                if line[:1] == "[" and line[2:3] == "]"}
    assert sorted(numbered) == ["[1]", "[2]"]  # both of Alice's documents are sources
    assert {numbered["[1]"], numbered["[2]"]} == {"[1] Valve supplier",
                                                  "[2] https://wiki.example/pumps",
                                                  "[1] https://wiki.example/pumps",
                                                  "[2] Valve supplier"} & set(numbered.values())
    # Only the one cited, named by its title, else its url.
    assert reply == f"The second source says so [2].\n\nSources:\n{numbered['[2]']}"


async def test_nothing_found_the_reply_says_no_document_matched(
        llm: Any, fake_openai: FakeOpenAI, documents: None) -> None:
    rt = await llm()  # chat 777 linked to nobody, nothing shared: it reads no document
    fake_openai.reply = "Paris."
    reply = await _ask(rt, "Who supplies the steam valves?")
    assert reply == f"Paris.\n\n{answers.NO_MATCH}"
    assert _system(fake_openai) == SYSTEM  # no sources, no instructions about them


async def test_shared_documents_reach_every_chat(llm: Any, fake_openai: FakeOpenAI,
                                                 documents: None) -> None:
    rt = await llm(shared=["docs:src.handbook"])
    fake_openai.reply = "28 days [1]."
    reply = await _ask(rt, "How many days of paid leave do employees get?")
    assert HANDBOOK in _system(fake_openai) and "Quorvane" not in _system(fake_openai)
    assert reply.endswith("\n\nSources:\n[1] Staff handbook")


async def test_retrieve_false_sends_the_conversation_alone(
        llm: Any, fake_openai: FakeOpenAI, runtime: Runtime, documents: None) -> None:
    rt = await llm(retrieve=False)
    await _link(runtime, "alice")
    fake_openai.reply = "No idea."
    assert await _ask(rt, "Who supplies the steam valves?") == "No idea."
    assert _system(fake_openai) == SYSTEM


async def test_the_questions_embedding_counts_in_the_budget(
        runtime: Runtime, fake_openai: FakeOpenAI, documents: None) -> None:
    """With a provider's embedder the question's embedding is a call of the chat's: its
    usage row names the chat and the linked account, and a spent chat budget stops it."""
    settings = sections(fake_openai)
    settings["pipeline"] = {"embedder": "a:embed-model"}
    settings["budgets"] = {"daily_tokens_per_chat": 1_000_000}
    rt = await open_runtime(dataclasses.replace(runtime.settings, sections=settings))
    try:
        await _link(runtime, "alice")
        await _ask(rt, "Who supplies the steam valves?")
        rows = [tuple(r) for r in await rt.pg.fetch(
            "SELECT kind, chat_key, account FROM provider_usage ORDER BY id")]
        assert rows[0] == ("embeddings", "telegram:777", ALICE)
        assert rows[-1] == ("chat", "telegram:777", ALICE)
    finally:
        await rt.close()


@pytest.mark.parametrize("chat", ["telegram"], indirect=True)
async def test_sources_repeats_the_last_answers_sources(
        chat: Chat, fake_openai: FakeOpenAI, runtime: Runtime, documents: None) -> None:
    await _link(runtime, "alice", str(chat.chat_id))  # type: ignore[attr-defined]
    fake_openai.reply = "Quorvane Industries [1]."
    await chat.start(sections(fake_openai))
    await chat.say("Who supplies the steam valves?")
    await chat.wait_for_text("Quorvane Industries [1].\n\nSources:\n[1] Valve supplier")
    await chat.say("/sources")
    await chat.wait_for_text("Sources:\n[1] Valve supplier")


def test_answers_settings_are_checked(settings: Settings) -> None:
    for bad, name in (({"top_k": 0}, "top_k"), ({"min_score": 2}, "min_score"),
                      ({"shared": "docs:*"}, "shared"), ({"retrieve": "yes"}, "retrieve"),
                      ({"context_tokens": -1}, "context_tokens"), ({"topk": 3}, "topk")):
        with pytest.raises(ConfigError, match=rf"\[answers\]\.{name}"):
            answers.AnswerSettings.of(dataclasses.replace(settings,
                                                          sections={"answers": bad}))
    assert answers.AnswerSettings.of(settings) == answers.AnswerSettings()
