"""Usage rows name the account whenever it is known, budget or not: the ``llm`` handler's
reply in a chat linked to an account is charged to that account (its first link), an
unlinked chat's to none. (A job's embed calls name its owner: tests/knowledge.)"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from gateway import keys
from gateway.conversations.model import Incoming, chat_key
from gateway.stores.runtime import Runtime, open_runtime
from tests.conversations.direct import llm_reply
from tests.fakes.openai import FakeOpenAI, provider_tables
from tests.fakes.pytest_plugin import OPENAI_KEY


@pytest.fixture
async def llm_runtime(runtime: Runtime, fake_openai: FakeOpenAI,
                      monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Runtime]:
    """``handler = "llm"`` on the fake, and no ``[budgets]`` at all."""
    monkeypatch.setenv("FAKE_OPENAI_KEY", OPENAI_KEY)
    rt = await open_runtime(dataclasses.replace(runtime.settings, sections={
        "providers": provider_tables(("a", fake_openai)),
        "conversations": {"handler": "llm", "providers": ["a"], "model": "m"},
        "answers": {"retrieve": False}}))
    try:
        yield rt
    finally:
        await rt.close()


async def _reply(rt: Runtime, chat: str, text: str) -> str:
    return await llm_reply(rt, chat, text)


async def test_a_linked_chats_reply_is_charged_to_its_account_without_a_budget(
        llm_runtime: Runtime) -> None:
    linked = Incoming("telegram", "100", None, "u1", "Ann", "x", "m")
    for sub in ("alice", "bob"):  # alice linked it first
        await llm_runtime.pg.execute(
            "INSERT INTO chat_links (sub, platform, chat_key, created_at)"
            " VALUES ($1, 'telegram', $2, now() - ($3 || ' minutes')::interval)",
            sub, chat_key(linked), "10" if sub == "alice" else "1")
    assert await _reply(llm_runtime, "100", "hello there") == "echo: hello there"
    assert await _reply(llm_runtime, "200", "anyone?") == "echo: anyone?"
    rows = await llm_runtime.pg.fetch(
        "SELECT chat_key, account, kind FROM provider_usage ORDER BY id")
    assert [tuple(r) for r in rows] == [("telegram:100", keys.owner_namespace("alice"), "chat"),
                                        ("telegram:200", None, "chat")]
