"""Intaker on a real Redis: claim + ADD, as one script (single instance) or as two commands
of one batch (the path a cluster takes; forced here on a single instance too)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hiredis import pack_command

from gateway import keys
from gateway.dedup.intake import Intake, Intaker
from gateway.pipeline.queue import AdmissionClass, PackedAdds, Quota, add_call
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


@pytest.mark.parametrize("kind", [("normal", "other", None, None),
                                  ("high", "code", Quota("src.demo", 5, 2**20), None),
                                  ("critical", "api_docs", None, AdmissionClass("webhooks", 99)),
                                  ("normal", "other", Quota("u", 0, 7), AdmissionClass("jobs", 0))])
def test_a_packed_claim_add_is_the_generic_call_byte_for_byte(kind: tuple[Any, ...]) -> None:
    """What ``PackedAdds`` packs once per kind, and the four strings it packs per call, give
    the bytes of ``add_call``'s keys and arguments packed whole (the call it replaces)."""
    priority, doc_type, quota, admission = kind
    packed = PackedAdds("600000", (str(TTL),))
    for item, payload in [("webhook:demo:1", '{"text":"x"}'), ("job-é", '{"text":"ü"}' * 50),
                          ("webhook:demo:1", "")]:
        add_keys, add_args = add_call(item, payload, priority, doc_type, window="600000",
                                      quota=quota, admission=admission)
        claim = keys.dedup_webhook("demo", item)
        call = ("EVALSHA", "f" * 40, len(add_keys) + 1, *add_keys, claim, *add_args, str(TTL))
        assert packed.pack("f" * 40, item, payload, claim, priority, doc_type, quota,
                           admission) == pack_command(call)  # type: ignore[arg-type]


async def test_a_packed_submit_claims_enqueues_and_refuses_as_the_script_does(
        runtime: Runtime) -> None:
    auto = AutoPipeline(runtime.durable)
    intaker = Intaker(auto, TTL)
    if not intaker.atomic or intaker._packed is None:
        pytest.skip("packed calls are for a single instance")
    quota = Quota("src.packed", 1, 0)
    first, again, other = await asyncio.gather(
        intaker.submit(keys.dedup_webhook("p", "1"), "webhook:p:1", '{"text":"a"}', quota=quota),
        intaker.submit(keys.dedup_webhook("p", "1"), "webhook:p:1", '{"text":"a"}', quota=quota),
        intaker.submit(keys.dedup_webhook("p", "2"), "webhook:p:2", '{"text":"b"}', quota=quota))
    assert (first, again, other) == (Intake.ACCEPTED, Intake.DUPLICATE, Intake.OVER_QUOTA)
    assert await runtime.durable.get(keys.dedup_webhook("p", "1")) == "done"
    assert await runtime.durable.exists(keys.dedup_webhook("p", "2")) == 0  # nothing written
    assert await ready_items(runtime.durable, "store") == ["webhook:p:1"]
    await runtime.durable.script_flush()  # forgotten: loaded again through the pipeline
    assert await intaker.submit(keys.dedup_webhook("p", "3"), "webhook:p:3", '{"text":"c"}'
                                ) is Intake.ACCEPTED
    await auto.drain()
