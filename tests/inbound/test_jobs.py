"""POST /v1/jobs and GET /v1/jobs/{id} on real servers."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import keys
from gateway.dedup import claims
from gateway.inbound.http_intake import INBOUND
from gateway.pipeline.stages import meta_key
from gateway.pipeline.status import document, ready_items
from gateway.stores.runtime import Runtime
from tests.helpers import registry_violations, request_keys

DOC = {"text": "How to rotate a webhook secret", "title": "Rotation",
       "url": "https://docs.test/rotate"}


async def test_job_with_id_is_idempotent(client: Any, runtime: Runtime) -> None:
    job = {"job_id": "doc-42", "priority": "high", "type": "api_docs", "document": DOC}
    first = await client.post("/v1/jobs", json=job)
    assert first.status == 202
    assert await first.json() == {"status": "accepted", "item_id": "doc-42"}
    again = await client.post("/v1/jobs", json={**job, "document": {"text": "changed"}})
    assert again.status == 200
    assert await again.json() == {"status": "duplicate", "item_id": "doc-42"}

    assert await ready_items(runtime.durable, "store") == ["doc-42"]
    assert await document(runtime.durable, "doc-42") == DOC
    # high (50) minus the api_docs bonus (5): "stage|status|base|bonus|failures|reclaims"
    stage, status, base, bonus, *_ = (await runtime.durable.hget(meta_key(), "doc-42")).split("|")
    assert (stage, status, float(base), float(bonus)) == ("store", "q", 50, 5)
    await client.app[INBOUND].auto.drain()  # the claim turns done with the next flush
    assert await claims.state(runtime.durable, keys.dedup_job("doc-42")) == claims.DONE
    assert await registry_violations(runtime.durable, "durable") == []


async def test_concurrent_posts_of_one_job_id_make_one_item(client: Any,
                                                            runtime: Runtime) -> None:
    job = {"job_id": "race", "document": DOC}
    responses = await asyncio.gather(*(client.post("/v1/jobs", json=job) for _ in range(20)))
    assert sorted(r.status for r in responses) == [200] * 19 + [202]
    assert {(await r.json())["item_id"] for r in responses} == {"race"}
    assert await runtime.durable.hlen(meta_key()) == 1


async def test_job_without_id_gets_a_fresh_item_each_time(client: Any,
                                                          runtime: Runtime) -> None:
    answers = [await (await client.post("/v1/jobs", json={"document": DOC})).json()
               for _ in range(2)]
    assert [a["status"] for a in answers] == ["accepted", "accepted"]
    assert answers[0]["item_id"] != answers[1]["item_id"]
    assert len(await ready_items(runtime.durable, "store")) == 2
    assert [k async for k in runtime.durable.scan_iter("dedup:*")] == []


async def test_priority_orders_the_queue(client: Any, runtime: Runtime) -> None:
    for job_id, priority in (("n", "normal"), ("c", "critical"), ("h", "high")):
        response = await client.post("/v1/jobs", json={"job_id": job_id, "priority": priority,
                                                       "document": DOC})
        assert response.status == 202
    assert await ready_items(runtime.durable, "store") == ["c", "h", "n"]


@pytest.mark.parametrize(("body", "fragment"), [
    ([], "JSON object"),
    ({}, "document"),
    ({"document": "text"}, "document"),
    ({"document": {"title": "no text"}}, "document.text"),
    ({"document": {"text": "  "}}, "document.text"),
    ({"document": {"text": "x", "url": 5}}, "document.url"),
    ({"document": DOC, "priority": "urgent"}, "priority"),
    ({"document": DOC, "type": "video"}, "type"),
    ({"document": DOC, "priority": []}, "priority"),  # unhashable: once a 500
    ({"document": {"text": "a\u0000b"}}, "u0000"),  # PostgreSQL could not store it
    ({"document": DOC, "type": {}}, "type"),
    ({"document": DOC, "job_id": ""}, "job_id"),
    ({"document": DOC, "job_id": "has space"}, "job_id"),
    ({"document": DOC, "job_id": 7}, "job_id"),
    ({"document": DOC, "job_id": "webhook:demo:1"}, "job_id"),
    ({"document": {"text": "x", "meta": functools.reduce(lambda v, _: [v], range(100), [])}},
     "nested deeper"),
])
async def test_invalid_jobs_are_400_and_write_nothing(client: Any, runtime: Runtime,
                                                      body: Any, fragment: str) -> None:
    response = await client.post("/v1/jobs", json=body)
    assert response.status == 400
    answer = await response.json()
    assert answer["error"] == "malformed" and fragment in answer["detail"]
    assert await request_keys(runtime.durable) == []


async def test_not_json_is_400_and_wrong_type_415(client: Any, runtime: Runtime) -> None:
    broken = await client.post("/v1/jobs", data=b"{", headers={"Content-Type":
                                                                "application/json"})
    assert broken.status == 400
    form = await client.post("/v1/jobs", data={"document": "x"})
    assert form.status == 415
    assert await request_keys(runtime.durable) == []


async def test_oversized_job_is_413(client: Any, runtime: Runtime) -> None:
    big = {"document": {"text": "x" * (1024 * 1024)}}
    response = await client.post("/v1/jobs", json=big)
    assert response.status == 413
    assert await request_keys(runtime.durable) == []


async def test_status_of_a_queued_job_and_an_unknown_one(client: Any) -> None:
    await client.post("/v1/jobs", json={"job_id": "st-1", "document": DOC})
    status = await client.get("/v1/jobs/st-1")
    assert status.status == 200
    assert await status.json() == {
        "item_id": "st-1", "state": "queued",
        "stages": {"store": "queued", "chunk": "pending", "embed": "pending",
                   "graph": "pending"}}
    missing = await client.get("/v1/jobs/never-seen")
    assert missing.status == 404
    assert (await missing.json())["error"] == "not_found"


job_bodies = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["job_id", "priority", "type", "document", "text", "title", "url"])
        | st.text(max_size=5), inner, max_size=5),
    max_leaves=10)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=job_bodies)
async def test_fuzzed_job_bodies_get_a_clear_answer(client: Any, body: Any) -> None:
    response = await client.post("/v1/jobs", data=json.dumps(body),
                                 headers={"Content-Type": "application/json"})
    assert response.status in (200, 202, 400), await response.text()
    answer = await response.json()
    assert ("error" in answer and answer["detail"]) if response.status == 400 else (
        answer["status"] in ("accepted", "duplicate"))


@pytest.mark.parametrize("path", ["/v1/jobs/%00", "/v1/jobs/a%0Ab", "/v1/jobs/" + "a" * 900])
async def test_status_of_an_impossible_id_is_404(client: Any, path: str) -> None:
    response = await client.get(path)
    assert response.status == 404  # a NUL once reached PostgreSQL and answered 500
