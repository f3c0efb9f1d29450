"""A stalled redis-durable never holds a sender's connection past the inbound write budget
(``WRITE_BUDGET_SECONDS``, 2 s): issue 25 point 3, as worded. The instance is frozen with
SIGSTOP for 6 s; signed webhook deliveries sent 0.5, 1.5 and 2.5 s into the stall (and a job
beside them) each get 503 + ``Retry-After`` within 2 s, although the Redis socket timeout is
3 s and a coalesced flush may take 5 s, and a delivery sent later queues behind the flush
already on the wire."""

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
from gateway.stores.runtime import open_runtime
from gateway.web.app import create_app
from tests.inbound.webhook_helpers import body_of, standard

pytestmark = pytest.mark.single_instance  # freezes a server of its own

STALL_SECONDS = 6.0
SENT_AT = (0.5, 1.5, 2.5)


async def test_deliveries_during_a_6_s_stall_are_answered_503_within_2_s(
        settings: Any, make_client: Callable[..., Any],
        redis_factory: Callable[..., Any]) -> None:
    assert WRITE_BUDGET_SECONDS < 2.0
    server = redis_factory("durable")
    rt = await open_runtime(dataclasses.replace(settings, durable_url=server.url))
    try:
        client = await make_client(create_app(rt), rt=rt)

        async def deliver(msg_id: str, at: float, stalled_at: float) -> tuple[int, str, float]:
            await asyncio.sleep(max(0.0, stalled_at + at - time.monotonic()))  # the schedule
            body = body_of({"text": msg_id})
            started = time.monotonic()
            async with client.post("/v1/webhooks/demo", data=body,
                                   headers=standard(body, msg_id)) as response:
                await response.read()
                return (response.status, response.headers.get("Retry-After", ""),
                        time.monotonic() - started)

        async def job(at: float, stalled_at: float) -> tuple[int, str, float]:
            await asyncio.sleep(max(0.0, stalled_at + at - time.monotonic()))
            started = time.monotonic()
            async with client.post("/v1/jobs", json={"job_id": "stalled-job",
                                                     "document": {"text": "x"}}) as response:
                await response.read()
                return (response.status, response.headers.get("Retry-After", ""),
                        time.monotonic() - started)

        assert (await deliver("before", 0, time.monotonic()))[0] == 202
        os.kill(server.proc.pid, signal.SIGSTOP)
        stalled_at = time.monotonic()
        try:
            answers = await asyncio.gather(
                *(deliver(f"stalled-{at}", at, stalled_at) for at in SENT_AT),
                job(1.0, stalled_at))
            assert time.monotonic() - stalled_at < STALL_SECONDS  # all inside the stall
        finally:
            await asyncio.sleep(max(0.0, stalled_at + STALL_SECONDS - time.monotonic()))
            os.kill(server.proc.pid, signal.SIGCONT)
        for status, retry_after, seconds in answers:
            assert status == 503 and retry_after, answers
            assert seconds < 2.0, answers
        # Awake again: the retries are taken in (or found: a write on the wire when the budget
        # ran out may have run once the server woke), each item once.
        for at in SENT_AT:
            assert (await deliver(f"stalled-{at}", 0, time.monotonic()))[0] in (200, 202)
        ready = await ready_items(rt.durable, "store")
        assert sorted(item for item in ready if item.startswith("webhook:")) == [
            "webhook:demo:before", *(f"webhook:demo:stalled-{at}" for at in SENT_AT)]
    finally:
        await rt.close()
