"""The route guard and the fallback route: what aiohttp middlewares used to do, without them."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient


async def test_head_follows_get_and_other_methods_get_405_with_allow(
        client: TestClient[Any, Any]) -> None:
    assert (await client.head("/healthz")).status == 200
    response = await client.delete("/v1/webhooks/demo")
    assert response.status == 405
    assert response.headers["Allow"] == "POST"
    assert (await response.json())["error"] == "method_not_allowed"
    response = await client.put("/v1/jobs/some-id")
    assert response.status == 405 and set(response.headers["Allow"].split(",")) == {
        "GET", "HEAD"}


async def test_unknown_paths_are_json_404_counted_as_unmatched(
        client: TestClient[Any, Any]) -> None:
    for path in ("/nope", "/v1/webhooks", "/static/../gateway/config.py", "/static/nope.js"):
        response = await client.get(path)
        assert response.status == 404, path
        assert (await response.json())["error"] == "not_found"
    text = await (await client.get("/metrics")).text()
    assert 'gateway_http_requests_total{route="unmatched",status="404"}' in text
    assert 'gateway_http_requests_total{route="/static/{name}",status="404"}' in text


async def test_static_files_are_served(client: TestClient[Any, Any]) -> None:
    response = await client.get("/static/push.js")
    assert response.status == 200
    assert "javascript" in response.headers["Content-Type"]
    assert "window.GatewayPush" in await response.text()


async def test_an_oversized_body_to_an_unknown_path_is_still_413(
        client: TestClient[Any, Any]) -> None:
    response = await client.post("/nope", data=b"x" * (1024 * 1024 + 1))
    assert response.status == 413
    assert (await response.json())["error"] == "payload_too_large"


async def test_every_route_of_the_app_is_guarded(client: TestClient[Any, Any]) -> None:
    """A route added around ``gateway.api.routes`` would answer errors as text, unmetered."""
    unguarded = [(route.method, route.resource.canonical if route.resource else "?")
                 for route in client.app.router.routes()
                 if route.handler.__qualname__ != "guarded.<locals>.guarded_handler"]
    assert unguarded == []
