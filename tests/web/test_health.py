from dataclasses import replace
from typing import Any

from aiohttp.test_utils import TestClient

from gateway.config import Settings
from gateway.stores.runtime import open_runtime


async def test_healthz_and_readyz(client: TestClient[Any, Any]) -> None:
    assert (await client.get("/healthz")).status == 200
    response = await client.get("/readyz")
    body = await response.json()
    assert response.status == 200, body
    assert set(body["checks"]) >= {"redis-durable", "redis-cache", "postgres"}


async def test_readyz_names_the_store_that_is_down(settings: Settings, make_client: Any) -> None:
    runtime = await open_runtime(replace(settings, cache_url="redis://127.0.0.1:1/0"))
    try:
        client = await make_client(rt=runtime)
        response = await client.get("/readyz")
        body = await response.json()
        assert response.status == 503
        assert body["error"] == "not_ready" and body["detail"] == "down: redis-cache"
        assert body["checks"]["redis-durable"]["ok"] and not body["checks"]["redis-cache"]["ok"]
    finally:
        await runtime.close()


async def test_metrics_exposes_prometheus_text(client: TestClient[Any, Any]) -> None:
    await client.get("/healthz")
    response = await client.get("/metrics")
    text = await response.text()
    assert response.status == 200
    assert 'gateway_http_requests_total{route="/healthz",status="200"}' in text


async def test_errors_are_json(client: TestClient[Any, Any]) -> None:
    response = await client.get("/no/such/route")
    assert response.status == 404
    assert await response.json() == {"error": "not_found", "detail": "Not Found"}
    response = await client.post("/healthz", data=b"x")
    assert response.status == 405
    assert (await response.json())["error"] == "method_not_allowed"


async def test_oversized_body_refused_on_declared_length(client: TestClient[Any, Any]) -> None:
    response = await client.post("/healthz", data=b"x" * (1024 * 1024 + 1))
    assert response.status == 413
    assert (await response.json())["error"] == "payload_too_large"
