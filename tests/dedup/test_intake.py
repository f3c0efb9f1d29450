"""Intaker on a real Redis: claim + ADD, as one script (single instance) or as two commands
of one batch (the path a cluster takes; forced here on a single instance too)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway import keys
from gateway.dedup.intake import Intake, Intaker
from gateway.pipeline.status import ready_items
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.runtime import Runtime

TTL = 600


@pytest.fixture(params=["atomic", "two-commands"])
async def intaker(request: pytest.FixtureRequest, runtime: Runtime) -> AsyncIterator[Intaker]:
    auto = AutoPipeline(runtime.durable)
    intaker = Intaker(auto, TTL)
    if request.param == "atomic" and not intaker.atomic:
        pytest.skip("a cluster always takes the two-command path")
    intaker.atomic = request.param == "atomic"
    yield intaker
    await auto.drain()


async def test_fifty_concurrent_submits_enqueue_once(intaker: Intaker, runtime: Runtime) -> None:
    claim = keys.dedup_webhook("demo", "storm")
    outcomes = await asyncio.gather(*(
        intaker.submit(claim, "webhook:demo:storm", {"text": "x"}) for _ in range(50)))
    assert sorted(o.value for o in outcomes) == ["accepted"] + ["duplicate"] * 49
    await intaker.auto.drain()
    assert await runtime.durable.get(claim) == "done"
    assert 0 < await runtime.durable.ttl(claim) <= TTL
    assert await ready_items(runtime.durable, "store") == ["webhook:demo:storm"]


async def test_an_expired_claim_does_not_let_a_queued_item_in_twice(
        intaker: Intaker, runtime: Runtime) -> None:
    claim = keys.dedup_job("expired")
    assert await intaker.submit(claim, "job-expired", '{"text":"x"}') is Intake.ACCEPTED
    await intaker.auto.drain()
    await runtime.durable.delete(claim)  # the dedup window ran out; ADD's 7 days did not
    assert await intaker.submit(claim, "job-expired", '{"text":"x"}') is Intake.DUPLICATE
    assert await ready_items(runtime.durable, "store") == ["job-expired"]


async def test_a_stuck_in_progress_claim_does_not_swallow_the_retry(
        intaker: Intaker, runtime: Runtime) -> None:
    """A two-command claim whose ADD and release both failed stays in-progress; the retry
    is still enqueued because ADD decides."""
    claim = keys.dedup_webhook("demo", "stuck")
    await runtime.durable.set(claim, "in-progress:dead-holder", ex=TTL)
    assert await intaker.submit(claim, "webhook:demo:stuck", {"text": "x"}) is Intake.ACCEPTED
    assert await ready_items(runtime.durable, "store") == ["webhook:demo:stuck"]


@pytest.mark.parametrize("claimed", [True, False])
async def test_a_present_guard_key_refuses_the_item_and_writes_nothing(
        intaker: Intaker, runtime: Runtime, claimed: bool) -> None:
    """The guard (a credential's revocation mark) is read with the write: present, nothing
    is claimed or enqueued; absent, the item goes in as usual."""
    guard = keys.revoked_key("0123456789ab")
    claim = keys.dedup_job("guarded") if claimed else None
    assert await intaker.submit(claim, "guarded", {"text": "x"}, guard=guard) is Intake.ACCEPTED
    await runtime.durable.set(guard, "1", ex=TTL)
    second = keys.dedup_job("guarded-2") if claimed else None
    assert await intaker.submit(second, "guarded-2", {"text": "x"},
                                guard=guard) is Intake.REFUSED
    await intaker.auto.drain()
    assert await ready_items(runtime.durable, "store") == ["guarded"]
    if second is not None:
        assert not await runtime.durable.exists(second)
