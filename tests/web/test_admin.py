"""Admin routes (bearer token), dead-letter operations and the pipeline's metrics."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from aiohttp import web

from gateway.access.authenticate import Authenticator
from gateway.api.errors import ApiError
from gateway.api.state import RUNTIME
from gateway.pipeline import deadletter, queue
from gateway.pipeline.stages import dead_key, meta_key
from gateway.pipeline.status import job_status, ready_items
from tests.conftest import TEST_ADMIN_TOKEN
from tests.helpers import wait_until

AUTH = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}


def _app(runtime) -> web.Application:
    from gateway.web.app import create_app

    return create_app(runtime, components=("gateway.web.health", "gateway.web.admin"))


async def _dead(runtime, item_id: str) -> None:
    await queue.enqueue(runtime.durable, item_id, {"text": item_id})
    lease = await queue.fetch(runtime.durable, "store", "w", 60_000)
    assert (await queue.fail(runtime.durable, lease, "bad", max_failures=1)).dead


async def test_admin_routes_need_the_token(runtime, make_client):
    """No, a wrong or a malformed credential: 401 with a Bearer challenge, each counted
    against the address; from the barrier's limit (the 10th) every request from it gets 429 +
    Retry-After, the right admin token included."""
    client = await make_client(_app(runtime))
    attempts = [(headers, method, path)
                for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"},
                                {"Authorization": "Basic x"},
                                {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}x"})
                for method, path in (("GET", "/v1/admin/queues"),
                                     ("GET", "/v1/admin/deadletter/store"),
                                     ("POST", "/v1/admin/deadletter/store/requeue"))]
    for n, (headers, method, path) in enumerate(attempts):
        resp = await client.request(method, path, headers=headers)
        body = await resp.json()
        if n < 9:  # the 10th failure sets the block and is itself refused with 429
            assert resp.status == 401, (n, headers, path)
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
            assert body["error"] == "unauthorized" and body["detail"]
            assert TEST_ADMIN_TOKEN not in json.dumps(body)
        else:
            assert resp.status == 429 and int(resp.headers["Retry-After"]) > 0, (n, body)
    resp = await client.get("/v1/admin/queues", headers=AUTH)
    assert resp.status == 429  # blocked addresses are refused whatever they present


async def test_an_admin_token_of_bytes_that_are_not_utf8_is_a_401(runtime) -> None:
    """aiohttp hands header bytes that are not UTF-8 over as surrogates (a raw-socket test of
    the webhook route shows it); the check must answer 401 for them, not raise (a 500)."""
    # Only what the check reads: aiohttp's own mocked request re-encodes headers strictly.
    request = SimpleNamespace(app={RUNTIME: runtime}, query={},
                              headers={"Authorization": "Bearer ab\udcff\udcfecd"})
    with pytest.raises(ApiError) as refused:
        await Authenticator(runtime)(request, "admin", False)  # type: ignore[arg-type]
    assert refused.value.status == 401 and refused.value.code == "unauthorized"


async def test_queues_deadletter_list_and_requeue(runtime, make_client):
    client = await make_client(_app(runtime))
    await _dead(runtime, "a")
    await _dead(runtime, "b")
    await queue.enqueue(runtime.durable, "c", {"text": "c"})
    resp = await client.get("/v1/admin/queues", headers=AUTH)
    assert resp.status == 200
    body = await resp.json()
    assert body["stages"]["store"] == {"ready": 1, "inflight": 0, "delayed": 0, "dead": 2}
    assert set(body["stages"]) == {"store", "chunk", "embed", "graph"}
    resp = await client.get("/v1/admin/deadletter/store", headers=AUTH)
    items = (await resp.json())["items"]
    assert [i["item_id"] for i in items] == ["a", "b"] and items[0]["reason"] == "bad"
    resp = await client.get("/v1/admin/deadletter/nope", headers=AUTH)
    assert resp.status == 404 and (await resp.json())["error"] == "not_found"
    resp = await client.post("/v1/admin/deadletter/store/requeue", headers=AUTH,
                             data="{not json")
    assert resp.status == 400
    assert await runtime.durable.llen(dead_key("store")) == 2  # bad input lost nothing
    resp = await client.post("/v1/admin/deadletter/store/requeue", headers=AUTH,
                             json={"count": 1})
    assert (await resp.json()) == {"stage": "store", "requeued": ["a"]}
    resp = await client.post("/v1/admin/deadletter/store/requeue", headers=AUTH)
    assert (await resp.json())["requeued"] == ["b"]
    assert set(await ready_items(runtime.durable, "store")) == {"a", "b", "c"}
    lease = await queue.fetch(runtime.durable, "store", "w", 60_000)
    assert lease.failures == 0 and lease.document is not None


async def test_purge_archives_then_drops(runtime):
    await _dead(runtime, "a")
    await _dead(runtime, "b")
    assert await deadletter.purge(runtime, "store", 1) == 1
    rows = await runtime.pg.fetch("SELECT item_id, reason, document FROM pipeline_dead_letters")
    assert [(r["item_id"], r["reason"], r["document"]) for r in rows] == [
        ("a", "bad", {"text": "a"})]
    assert not await runtime.durable.hexists(meta_key(), "a")
    assert await runtime.durable.hexists(meta_key(), "b")
    assert (await job_status(runtime, "a"))["state"] == "dead"
    assert await deadletter.purge(runtime, "store", 0) == 0
    assert await runtime.durable.llen(dead_key("store")) == 1


async def test_metrics_expose_queue_depth_and_counters(runtime, make_client):
    await queue.enqueue(runtime.durable, "m1", {"text": "x"})
    await queue.enqueue(runtime.durable, "m2", {"text": "y"})
    client = await make_client(_app(runtime))

    async def scraped() -> bool:
        text = await (await client.get("/metrics")).text()
        return ('gateway_pipeline_queue_depth{stage="store",state="ready"} 2.0' in text
                and "gateway_pipeline_enqueued_total" in text)

    await wait_until(scraped, timeout=10, message="depth gauge in /metrics")
