"""Maintenance mode on the real stores and the full app: inbound refused with 503 and a
reason, reads served, /readyz out of rotation, workers idle, everything back when it ends."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.app.worker import run_workers
from gateway.leases import maintenance
from gateway.pipeline import queue
from gateway.pipeline.status import job_status, ready_items
from gateway.pipeline.worker import WorkerConfig
from gateway.stores.runtime import Runtime
from tests.conftest import ServerSet
from tests.helpers import gateway_cli, registry_violations, wait_until
from tests.inbound.webhook_helpers import body_of, standard

FAST = WorkerConfig(lease=2.0, heartbeat=0.3, reclaim_interval=0.2, backoff=0.05,
                    backoff_cap=0.2, idle_max=0.05, shutdown_grace=5)


async def _gateway(servers: ServerSet, *args: str) -> dict[str, Any]:
    code, out, err = await gateway_cli(servers, "maintenance", *args)
    assert code == 0, err
    (line,) = out.splitlines()
    return dict(json.loads(line))


async def test_the_command_switches_it_on_and_off_with_a_reason(
        runtime: Runtime, servers: ServerSet) -> None:
    assert await _gateway(servers, "status") == {"on": False, "reason": None,
                                                 "expires_in": None}
    on = await _gateway(servers, "on", "--reason", "restoring PostgreSQL", "--for", "600")
    assert on["on"] is True and on["reason"] == "restoring PostgreSQL"
    assert 590 < on["expires_in"] <= 600
    assert (await _gateway(servers, "status"))["reason"] == "restoring PostgreSQL"
    assert await registry_violations(runtime.durable, "durable") == []
    assert (await _gateway(servers, "off"))["on"] is False
    assert (await maintenance.read(runtime.durable)).on is False


async def test_it_ends_on_its_own(runtime: Runtime) -> None:
    await maintenance.switch_on(runtime.durable, "short", seconds=0.5)
    assert (await maintenance.read(runtime.durable)).on
    await wait_until(lambda: _is_off(runtime), timeout=5, message="the lease expired")


async def _is_off(runtime: Runtime) -> bool:
    return not (await maintenance.read(runtime.durable)).on


async def test_inbound_is_refused_reads_work_and_readyz_is_out_until_it_ends(
        runtime: Runtime, client: Any) -> None:
    await queue.enqueue(runtime.durable, "before", {"text": "queued before"})
    await maintenance.switch_on(runtime.durable, "restoring PostgreSQL", seconds=120)
    await wait_until(lambda: _refused(client), timeout=2, message="every replica sees it")
    body = body_of({"text": "order created"})
    hook = await client.post("/v1/webhooks/demo", data=body, headers=standard(body, "m1"))
    assert hook.status == 503 and 0 < int(hook.headers["Retry-After"]) <= 60
    assert await hook.json() == {"error": "maintenance", "detail": "restoring PostgreSQL"}
    ready = await client.get("/readyz")
    assert ready.status == 503 and "maintenance" in (await ready.json())["detail"]
    assert (await client.get("/v1/jobs/before")).status == 200  # reads keep working
    assert await ready_items(runtime.durable, "store") == ["before"]  # nothing accepted
    await maintenance.switch_off(runtime.durable)
    await wait_until(lambda: _accepted(client), timeout=2, message="resumed after off")
    again = await client.post("/v1/webhooks/demo", data=body, headers=standard(body, "m1"))
    assert again.status == 202  # the refused delivery's retry is accepted now
    assert (await client.get("/readyz")).status == 200


# Probes that enqueue nothing either way: an empty job is 400 unless maintenance refuses it
# first (503), so they tell which state the serving process sees.
async def _refused(client: Any) -> bool:
    return bool((await client.post("/v1/jobs", json={})).status == 503)


async def _accepted(client: Any) -> bool:
    return bool((await client.post("/v1/jobs", json={})).status == 400)


async def test_workers_finish_what_they_hold_and_take_nothing_new(runtime: Runtime) -> None:
    await maintenance.switch_on(runtime.durable, "restore", seconds=120)
    await queue.enqueue(runtime.durable, "waits", {"text": "waits for the end"})
    view = maintenance.view_for(runtime.durable)
    stop = asyncio.Event()
    task = asyncio.create_task(run_workers(runtime, stop, config=FAST, concurrency=1))
    try:
        reads = view.reads
        await wait_until(lambda: view.reads >= reads + 3, timeout=5,
                         message="the workers looked at the switch and stayed idle")
        assert await ready_items(runtime.durable, "store") == ["waits"]
        await maintenance.switch_off(runtime.durable)
        await wait_until(lambda: _done(runtime, "waits"), timeout=20, message="resumed")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def _done(runtime: Runtime, item_id: str) -> bool:
    status = await job_status(runtime, item_id)
    return bool(status and status["state"] == "done")
