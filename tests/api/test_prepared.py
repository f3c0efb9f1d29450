"""``PreparedJson`` writes, byte for byte, what aiohttp writes for the same ``web.Response``
(its own way taken where a request or the app asks for more than the plain case)."""

from __future__ import annotations

import asyncio
import re

from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.api.prepared import PreparedJson

BODY = b'{"status": "accepted", "item_id": "webhook:demo:\\u00e9-1"}'


async def _raw(server: TestServer, path: str, request_head: str) -> list[bytes]:
    """Two requests on one connection (or one, for a close); the answers' raw bytes."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        count = 1 if "close" in request_head or "HTTP/1.0" in request_head else 2
        writer.write((request_head.format(path=path)) .encode() * count)
        answers = []
        for _ in range(count):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
            answers.append(re.sub(rb"Date: [^\r]+", b"Date: -", head)
                           + await reader.readexactly(length))
        return answers
    finally:
        writer.close()


async def _both(app: web.Application, request_head: str,
                prepared: list[web.StreamResponse] | None = None
                ) -> tuple[list[bytes], list[bytes]]:
    """The answers of ``PreparedJson`` and of aiohttp's own ``web.Response``; ``prepared``
    collects the former."""
    prepared = [] if prepared is None else prepared

    async def fast(request: web.Request) -> web.StreamResponse:
        response = PreparedJson(202, BODY)
        prepared.append(response)
        return response

    async def plain(request: web.Request) -> web.StreamResponse:
        return web.Response(status=202, body=BODY, content_type="application/json")

    app.router.add_post("/fast", fast)
    app.router.add_post("/plain", plain)
    server = TestServer(app)
    await server.start_server()
    try:
        return (await _raw(server, "/fast", request_head),
                await _raw(server, "/plain", request_head))
    finally:
        await server.close()


POST = ("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\n\r\n{{}}")


async def test_the_plain_case_writes_what_aiohttp_writes() -> None:
    prepared: list[web.StreamResponse] = []
    fast, plain = await _both(web.Application(), POST, prepared)
    assert fast == plain and len(fast) == 2
    # Its own way: aiohttp's would have put the length in the response's header map.
    assert [("Content-Length" in answer.headers) for answer in prepared] == [False, False]
    assert fast[0].startswith(b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\n")
    assert fast[0].endswith(b"\r\n\r\n" + BODY)


async def test_a_closing_or_http10_request_gets_aiohttp_own_answer() -> None:
    fast, plain = await _both(web.Application(), POST.replace("Host: x", "Host: x\r\n"
                                                              "Connection: close"))
    assert fast == plain and b"Connection: close" in fast[0]
    fast, plain = await _both(web.Application(), POST.replace("HTTP/1.1", "HTTP/1.0"))
    assert fast == plain


async def test_an_app_with_prepare_handlers_gets_their_headers() -> None:
    app = web.Application()

    async def add_header(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["X-Added"] = "1"

    app.on_response_prepare.append(add_header)
    fast, plain = await _both(app, POST)
    assert fast == plain and b"X-Added: 1" in fast[0]
