"""A job id reused after its dedup window is a new item: issue 25 point 4, as worded, with
real time (no clock moved by hand): ``GATEWAY_DEDUP_TTL=2``, the same ``job_id`` 3.5 s after
its first run finished."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest

from gateway.pipeline.stages import STAGES
from gateway.pipeline.status import job_status
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app
from tests.helpers import wait_until
from tests.pipeline.helpers import workers

JOB_ID = "weekly-report"


async def _stage_rows(rt: Runtime) -> list[str]:
    rows = await rt.pg.fetch("SELECT kind FROM feed WHERE topic = 'pipeline'"
                             " AND payload->>'item_id' = $1 ORDER BY \"offset\"", JOB_ID)
    return [r["kind"] for r in rows]


@pytest.mark.parametrize("shards", [1, 3])  # 3: the job's id hashes to shard 1, not {pipeline}
async def test_a_job_id_reused_3_5_s_after_its_run_with_a_2_s_window_runs_again(
        runtime: Runtime, settings: Any, make_client: Callable[..., Any], shards: int) -> None:
    rt = await open_runtime(dataclasses.replace(settings, dedup_ttl=2, pipeline_shards=shards))
    try:
        client = await make_client(create_app(rt), rt=rt)

        async def submit(text: str) -> tuple[int, dict[str, Any]]:
            async with client.post("/v1/jobs", json={"job_id": JOB_ID,
                                                     "document": {"text": text}}) as response:
                return response.status, await response.json()

        assert await submit("first edition about #alpha lighthouses") == (
            202, {"status": "accepted", "item_id": JOB_ID})
        async with workers(rt, concurrency=1):
            await wait_until(lambda: _done(rt), timeout=20, message="the first run")
        finished = time.monotonic()
        assert await _stage_rows(rt) == list(STAGES)

        await asyncio.sleep(finished + 3.5 - time.monotonic())  # the scenario's own timing
        assert await submit("second edition about #beta submarines") == (
            202, {"status": "accepted", "item_id": JOB_ID})
        async with workers(rt, concurrency=1):
            await wait_until(lambda: _ran_twice(rt), timeout=20,
                             message="every stage of the second run in the feed")

        assert await _stage_rows(rt) == list(STAGES) * 2  # all four stages ran again
        assert await job_status(rt, JOB_ID) == {
            "item_id": JOB_ID, "state": "done", "stages": dict.fromkeys(STAGES, "done")}
        assert await rt.pg.fetchval(
            "SELECT body FROM pipeline_documents WHERE item_id = $1", JOB_ID) == \
            "second edition about #beta submarines"
        edges = await rt.pg.fetch("SELECT target FROM pipeline_edges WHERE item_id = $1", JOB_ID)
        assert [e["target"] for e in edges] == ["beta"]
        async with client.get("/v1/search", params={"q": "second edition submarines"}) as found:
            assert found.status == 200
            results = (await found.json())["results"]
        assert results and results[0]["item_id"] == JOB_ID
        assert all("submarines" in r["text"] and "lighthouses" not in r["text"]
                   for r in results)
    finally:
        await rt.close()


async def _done(rt: Runtime) -> bool:
    status = await job_status(rt, JOB_ID)
    return status is not None and status["state"] == "done"


async def _ran_twice(rt: Runtime) -> bool:
    return len(await _stage_rows(rt)) >= 2 * len(STAGES) and await _done(rt)
