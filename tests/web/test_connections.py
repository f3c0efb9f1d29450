"""The connection gate of ``serve`` on a real socket: caps per address and in all, the reserve
that keeps health probes and signed deliveries answered, and the idle, slow-header and
slow-body timeouts. Loopback addresses 127.0.0.x stand for distinct clients."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.config import Settings
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web import connections
from gateway.web.app import create_app
from tests.conftest import TEST_ADMIN_TOKEN
from tests.inbound.webhook_helpers import standard

ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}
Serve = Callable[..., Awaitable[int]]


@pytest.fixture
async def serve(settings: Settings, runtime: Runtime) -> AsyncIterator[Serve]:
    """``await serve(**[connections])`` → the port of a gated server of the full app."""
    started: list[tuple[web.AppRunner, Runtime]] = []

    async def start(**table: Any) -> int:
        changed = dataclasses.replace(settings, sections={
            **settings.sections, "connections": table})
        rt = await open_runtime(changed)
        app = create_app(rt)
        runner = web.AppRunner(app, access_log=None, **connections.runner_options(changed))
        await runner.setup()
        started.append((runner, rt))
        site = connections.gated_site(runner, app, changed)
        await site.start()
        return site.port

    yield start
    for runner, rt in started:
        await runner.cleanup()
        await rt.close()


async def idle(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection from ``source`` that sends nothing (it holds a descriptor)."""
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def refused_at_once(port: int, source: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    """The status, headers and JSON body the gate writes before reading anything."""
    reader, writer = await idle(port, source)
    try:
        async with asyncio.timeout(5):
            raw = await reader.read()  # the server closes after its answer
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


async def wait_for_count(gate_port: int, expected: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not expected():
        assert time.monotonic() < deadline, "connections were not counted in time"
        await asyncio.sleep(0.01)


def request_from(source: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(source, 0)))


async def test_one_address_past_its_cap_is_refused_and_others_are_not(serve: Serve) -> None:
    port = await serve(per_ip=3)
    held = [await idle(port, "127.0.0.2") for _ in range(3)]
    try:
        status, headers, body = await refused_at_once(port, "127.0.0.2")
        assert status == 429 and headers["Retry-After"] == "5"
        assert body["error"] == "rate_limited"
        async with request_from("127.0.0.3") as bystander:
            async with bystander.get(f"http://127.0.0.1:{port}/healthz") as health:
                assert health.status == 200
            async with bystander.get(f"http://127.0.0.1:{port}/v1/admin/queues",
                                     headers=ADMIN) as queues:
                assert queues.status == 200
    finally:
        for _, writer in held:
            writer.close()


async def test_past_the_cap_health_and_signed_deliveries_are_still_answered(
        serve: Serve) -> None:
    port = await serve(max=4, reserve=3, per_ip=100)
    held = [await idle(port, f"127.0.0.{10 + i}") for i in range(4)]
    try:
        url = f"http://127.0.0.1:{port}"
        body = b'{"event": "paid"}'
        async with request_from("127.0.0.50") as late:
            async with late.get(f"{url}/healthz") as health:
                assert health.status == 200
            async with late.post(f"{url}/v1/webhooks/demo", data=body,
                                 headers=standard(body, "over-cap-1")) as delivery:
                assert delivery.status == 202
        async with request_from("127.0.0.51") as client:
            async with client.get(f"{url}/v1/feed?topic=pipeline", headers=ADMIN) as feed:
                assert feed.status == 503
                assert feed.headers["Retry-After"] == "5"
                assert (await feed.json())["error"] == "busy"
        more = [await idle(port, f"127.0.0.{60 + i}") for i in range(3)]  # the reserve
        held += more
        # Past max + reserve the oldest idle connection makes room for the new one.
        async with request_from("127.0.0.70") as newest:
            async with newest.get(f"{url}/healthz") as health:
                assert health.status == 200
        async with asyncio.timeout(5):
            assert await held[0][0].read() == b""  # the oldest, closed by the server
    finally:
        for _, writer in held:
            writer.close()


async def test_past_the_reserve_with_nothing_idle_a_new_connection_is_refused_at_once(
        serve: Serve) -> None:
    """Streams and half-sent bodies are requests in progress: none is closed to make room,
    so past max + reserve the gate refuses."""
    port = await serve(max=4, reserve=3, per_ip=100)
    url = f"http://127.0.0.1:{port}"
    slow = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        streams = [await http.get(f"{url}/v1/stream", params={"topics": "pipeline"},
                                  headers=ADMIN) for _ in range(4)]
        try:
            assert [s.status for s in streams] == [200] * 4
            for i in range(3):  # the reserve: deliveries whose bodies are still arriving
                _, writer = await idle(port, f"127.0.0.{60 + i}")
                writer.write(b"POST /v1/webhooks/demo HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
                slow.append(writer)
            await asyncio.sleep(0.2)  # let the server read the heads (no condition to see)
            status, headers, answer = await refused_at_once(port, "127.0.0.70")
            assert status == 503 and headers["Retry-After"] == "5"
            assert answer["error"] == "busy"
            assert not any(s.content.at_eof() for s in streams)
        finally:
            for stream in streams:
                stream.close()
            for writer in slow:
                writer.close()


async def test_a_client_that_never_finishes_its_request_head_is_closed(serve: Serve) -> None:
    port = await serve(idle_seconds=1)
    reader, writer = await idle(port, "127.0.0.2")
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    started = time.monotonic()
    try:
        async with asyncio.timeout(10):
            assert await reader.read() == b""  # closed by the server
    finally:
        writer.close()
    assert time.monotonic() - started < 5


async def test_a_body_that_does_not_arrive_in_time_gets_408(serve: Serve) -> None:
    port = await serve(body_seconds=1)
    reader, writer = await idle(port, "127.0.0.2")
    writer.write(b"POST /v1/webhooks/demo HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\"")
    raw = b""
    try:
        async with asyncio.timeout(10):
            # The answer comes at once; the close may wait for aiohttp's lingering read.
            while b"}" not in raw:
                chunk = await reader.read(4096)
                assert chunk, f"closed without an answer: {raw!r}"
                raw += chunk
    finally:
        writer.close()
    assert raw.startswith(b"HTTP/1.1 408")
    assert b'"request_timeout"' in raw


@pytest.mark.parametrize("head", [
    b"GET /v1/stream?topics=pipeline&access_token=SECRET-TOKEN&since=" + b"0" * 9000,
    b"GET /v1/feed?topic=pipeline HTTP/1.1\r\nX-Big: SECRET-TOKEN" + b"y" * 9000,
    b"GET /v1/feed?topic=pipeline HTTP/1.1\r\nX-Ctl: SECRET-TOKEN\x01",
], ids=["line-too-long", "header-too-long", "header-control"])
async def test_what_the_parser_refuses_is_a_json_400_quoting_nothing(
        serve: Serve, head: bytes) -> None:
    """aiohttp answers these before any route, as plain text quoting the refused line (with
    a query's access_token); the gated site of serve answers JSON like every other error."""
    port = await serve()
    reader, writer = await idle(port, "127.0.0.2")
    writer.write(head + (b"" if b"HTTP/1.1" in head else b" HTTP/1.1") + b"\r\nHost: x\r\n\r\n")
    try:
        async with asyncio.timeout(10):
            raw = await reader.read()  # the answer, then the close
    finally:
        writer.close()
    answer_head, _, body = raw.partition(b"\r\n\r\n")
    assert answer_head.split(b" ")[1] == b"400", answer_head
    assert b"Content-Type: application/json" in answer_head, answer_head
    assert json.loads(body)["error"] == "bad_request"
    assert b"SECRET-TOKEN" not in raw
