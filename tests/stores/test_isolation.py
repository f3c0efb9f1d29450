"""Client reads cannot starve inbound writes, and a stalled store answers fast: client reads
have pools of their own (exhausted, they answer 503 within the read wait while deliveries go
on), and every Redis call has a socket timeout (a SIGSTOPped redis-durable gives 503 +
Retry-After, not a hang)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from gateway.api.routes import WRITE_BUDGET_SECONDS
from gateway.pipeline.status import ready_items
from gateway.stores import redis as redis_clients
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.runtime import (
    READ_STATEMENT_SECONDS,
    READ_WAIT_SECONDS,
    Runtime,
    open_runtime,
)
from gateway.web.app import create_app
from tests.inbound.webhook_helpers import body_of, standard

pytestmark = pytest.mark.single_instance  # holds the single pool of one client


async def deliver(client: Any, msg_id: str) -> Any:
    body = body_of({"text": msg_id})
    return await client.post("/v1/webhooks/demo", data=body, headers=standard(body, msg_id))


async def test_exhausted_read_pools_leave_deliveries_alone(
        make_client: Callable[..., Any], runtime: Runtime) -> None:
    assert runtime.read_durable is not None and runtime.read_durable is not runtime.durable
    client = await make_client()
    pool = runtime.read_durable.connection_pool
    held = [await pool.get_connection() for _ in range(pool.max_connections)]
    try:
        started = time.monotonic()
        deliveries = await asyncio.gather(*(deliver(client, f"busy-{i}") for i in range(20)))
        assert [r.status for r in deliveries] == [202] * 20
        assert time.monotonic() - started < READ_WAIT_SECONDS  # none waited on the reads
        async with client.get("/v1/jobs/anything") as read:
            assert read.status == 503  # no connection came free within the wait
            assert read.headers["Retry-After"]
            assert (await read.json())["error"] == "store_unavailable"
        assert time.monotonic() - started < READ_WAIT_SECONDS + 3
    finally:
        for connection in held:
            await pool.release(connection)
    async with client.get("/v1/jobs/webhook:demo:busy-0") as read:
        assert read.status == 200


async def test_a_stalled_durable_instance_gives_fast_503s(
        make_client: Callable[..., Any], runtime: Runtime,
        redis_factory: Callable[..., Any]) -> None:
    server = redis_factory("durable")
    rt = await open_runtime(dataclasses.replace(runtime.settings, durable_url=server.url))
    try:
        client = await make_client(create_app(rt), rt=rt)
        assert (await deliver(client, "before-stall")).status == 202
        async with client.get("/v1/jobs/webhook:demo:before-stall") as read:
            assert read.status == 200  # the read pool holds a live connection now
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            stalled = await deliver(client, "during-stall")
            elapsed = time.monotonic() - started
            assert stalled.status == 503 and stalled.headers["Retry-After"]
            assert elapsed < WRITE_BUDGET_SECONDS + 0.25, elapsed  # the inbound write budget
            started = time.monotonic()
            async with client.get("/v1/jobs/webhook:demo:before-stall") as read:
                assert read.status == 503
            # The read's credential check (the barrier's coalesced look-up) queues behind the
            # delivery's flush still on the wire (5 s from its start), then the read itself
            # is bounded by the socket timeout.
            assert time.monotonic() - started < (
                AutoPipeline(rt.durable).flush_timeout + redis_clients.REDIS_TIMEOUT_SECONDS)
            async with client.get("/healthz") as health:
                assert health.status == 200  # liveness reads no store
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        # The stalled write may still have run once the server woke: the retry is then a
        # duplicate. Either way the delivery is in the pipeline exactly once.
        assert (await deliver(client, "during-stall")).status in (200, 202)
        assert await ready_items(rt.durable, "store") == [
            "webhook:demo:before-stall", "webhook:demo:during-stall"]
    finally:
        await rt.close()


async def test_a_locked_database_gives_readers_a_fast_503(
        make_client: Callable[..., Any], runtime: Runtime) -> None:
    """A client read waits at most the read pool's statement budget, then 503."""
    client = await make_client()
    async with client.get("/v1/feed?topic=pipeline") as before:
        assert before.status == 200
    async with runtime.pg.acquire() as conn, conn.transaction():
        await conn.execute("LOCK TABLE feed_topics IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        async with client.get("/v1/feed?topic=pipeline") as read:
            assert read.status == 503 and read.headers["Retry-After"]
        elapsed = time.monotonic() - started
        assert READ_STATEMENT_SECONDS - 0.5 < elapsed < READ_STATEMENT_SECONDS + 3, elapsed
    async with client.get("/v1/feed?topic=pipeline") as after:
        assert after.status == 200
