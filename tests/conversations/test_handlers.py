"""Handler choice by configuration, the HTTP-callback handler against a local server, and a
cache outage that must change no outcome."""

from __future__ import annotations

import dataclasses
import itertools
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.config import ConfigError, Settings
from gateway.conversations.handlers import default_handler, load_handler
from gateway.conversations.service import APOLOGY, ConversationService, Incoming
from gateway.stores.runtime import Runtime, open_runtime
from tests.conversations.fast import with_sections

_ids = itertools.count(1)


def msg(text: str) -> Incoming:
    return Incoming(platform="mattermost", chat="chan1", thread=None, user_id="u1",
                    user_name="bob", text=text, message_id=f"post{next(_ids)}")


@pytest.fixture
async def callback_server() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A conversation endpoint: answers with the message count it received, or 500 on
    "explode"."""
    seen: list[dict[str, Any]] = []

    async def answer(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        if body["message"]["text"] == "explode":
            return web.Response(status=500)
        return web.json_response(
            {"reply": f"model saw {len(body['messages'])}: {body['message']['text']}"})

    app = web.Application()
    app.router.add_post("/answer", answer)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("/answer")), seen
    finally:
        await server.close()


async def test_http_handler_posts_the_conversation_and_sends_its_answer(
        runtime: Runtime, settings: Settings,
        callback_server: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = callback_server
    rt = await open_runtime(with_sections(settings, conversations={
        "handler": "http", "handler_url": url, "handler_timeout": 5}))
    try:
        service = ConversationService(rt)
        sent: list[str] = []

        async def send(text: str) -> None:
            sent.append(text)

        await service.handle(msg("first"), send)
        await service.handle(msg("second"), send)
        await service.handle(msg("explode"), send)
    finally:
        await rt.close()
    assert sent == ["model saw 1: first", "model saw 3: second", APOLOGY]
    last = seen[1]
    assert last["platform"] == "mattermost" and last["chat"] == "chan1"
    assert [(m["role"], m["text"]) for m in last["messages"]] == [
        ("user", "first"), ("bot", "model saw 1: first"), ("user", "second")]
    assert last["message"]["user_name"] == "bob"


def test_handler_configuration(settings: Settings) -> None:
    assert load_handler(settings) is default_handler
    named = dataclasses.replace(settings, sections={"conversations": {
        "handler": "gateway.conversations.handlers:default_handler"}})
    assert load_handler(named) is default_handler
    for bad in ({"handler": "http"}, {"handler": "http", "handler_url": "ftp://x"},
                {"handler": "nope"}, {"handler": "no.such.module:fn"}):
        broken = dataclasses.replace(settings, sections={"conversations": bad})
        with pytest.raises(ConfigError) as raised:
            load_handler(broken)
        assert raised.value.variable.startswith("[conversations]")


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_cache_outage_changes_no_outcome(runtime: Runtime, settings: Settings) -> None:
    """redis-cache unreachable: pointers and push signals fail, the conversation does not."""
    down = with_sections(dataclasses.replace(
        settings, cache_url=f"redis://127.0.0.1:{_dead_port()}/0"))
    rt = await open_runtime(down)
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    try:
        service = ConversationService(rt)
        await service.handle(msg("one"), send)
        await service.handle(msg("two"), send)
    finally:
        await rt.close()
    assert sent == ["echo: one (1 messages)", "echo: two (3 messages)"]
    assert await runtime.pg.fetchval("SELECT count(*) FROM conversations") == 1
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed") == 4
