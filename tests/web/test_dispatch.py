"""The webhooks' lean dispatch (``gateway.web.dispatch``) against aiohttp's router: the same
answers either way, and the lean way taken only where it may be."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.stores.runtime import Runtime
from gateway.web import dispatch
from gateway.web.app import create_app
from tests.inbound.webhook_helpers import body_of, standard


async def _client(runtime: Runtime, lean: bool) -> TestClient[Any, Any]:
    """A client on the full app, routed by aiohttp's router alone or with the lean way."""
    app = create_app(runtime)
    client = TestClient(TestServer(app))
    await client.start_server()
    runner = client.server.runner
    assert runner is not None and runner.server is not None
    if lean:
        normal = runner.server.request_handler
        dispatch.install(runner.server, app)
        assert runner.server.request_handler is not normal  # the app allows it: installed
    return client


async def _answers(client: TestClient[Any, Any]) -> list[tuple[int, Any, str | None]]:
    body = body_of({"type": "x", "text": "same answers"})
    out = []
    cases: list[tuple[str, bytes, dict[str, str]]] = [
        ("/v1/webhooks/demo", body, standard(body, "d-1")),  # teaches the name
        ("/v1/webhooks/demo", body, standard(body, "d-2")),  # accepted, lean
        ("/v1/webhooks/demo", body, standard(body, "d-2")),  # duplicate
        ("/v1/webhooks/demo", body, {**standard(body, "d-3"), "webhook-signature": "v1,AAAA"}),
        ("/v1/webhooks/demo", body, {**standard(body, "d-4"), "Content-Type": "text/plain"}),
        ("/v1/webhooks/demo", b"not json", standard(b"not json", "d-5")),
        ("/v1/webhooks/nosuch", body, standard(body, "d-6")),
        ("/v1/webhooks/demo?x=1", body, standard(body, "d-7")),
        ("/v1/webhooks/demo/", body, standard(body, "d-8")),
        ("/v1/webhooks/d%65mo", body, standard(body, "d-9")),
    ]
    for path, data, headers in cases:
        response = await client.post(path, data=data, headers=headers)
        text = await response.text()
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        out.append((response.status, value, response.headers.get("Content-Type")))
    expect = await client.post("/v1/webhooks/demo", data=body,
                               headers={**standard(body, "d-10"), "Expect": "100-continue"})
    out.append((expect.status, await expect.json(), expect.headers.get("Content-Type")))
    wrong = await client.get("/v1/webhooks/demo")
    out.append((wrong.status, await wrong.json(), wrong.headers.get("Allow")))
    return out


async def test_lean_and_router_give_the_same_answers(runtime: Runtime,
                                                     monkeypatch: Any) -> None:
    marked: list[bool] = []
    original = dispatch.UrlMappingMatchInfo

    def marking(match: dict[str, str], route: Any) -> Any:
        marked.append(True)
        return original(match, route)

    answers = {}
    for lean in (False, True):
        client = await _client(runtime, lean)
        try:
            await runtime.durable.flushdb()
            if lean:
                monkeypatch.setattr(dispatch, "UrlMappingMatchInfo", marking)
            answers[lean] = await _answers(client)
        finally:
            await client.close()
    assert answers[True] == answers[False]
    assert answers[True][1][0] == 202 and answers[True][2][0] == 200
    # The lean way: the accepted, duplicate, bad signature, 415 and 400 after the first
    # (which teaches the name), and "d%65mo" (the client sends it as "demo"); never the
    # query string, the trailing slash, an unknown name, Expect, GET.
    assert len(marked) == 6


async def test_not_installed_with_a_middleware(runtime: Runtime) -> None:
    @web.middleware
    async def seeing(request: web.Request, handler: Any) -> web.StreamResponse:
        return await handler(request)

    app = create_app(runtime)
    app.middlewares.append(seeing)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        raise AssertionError

    assert dispatch.lean(app, handle) is handle
