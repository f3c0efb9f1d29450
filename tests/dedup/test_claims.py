import asyncio

from gateway import keys
from gateway.dedup import claims
from gateway.stores.runtime import Runtime


async def test_first_claims_then_duplicates(runtime: Runtime) -> None:
    key = keys.dedup_webhook("demo", "msg_1")
    first = await claims.claim(runtime.durable, key, 60)
    second = await claims.claim(runtime.durable, key, 60)
    assert first.claimed and not second.claimed
    assert await claims.state(runtime.durable, key) == claims.IN_PROGRESS
    await claims.mark_done(runtime.durable, first, 60)
    assert await claims.state(runtime.durable, key) == claims.DONE
    assert 0 < await runtime.durable.ttl(key) <= 60
    assert not (await claims.claim(runtime.durable, key, 60)).claimed


async def test_release_lets_the_retry_through(runtime: Runtime) -> None:
    key = keys.dedup_webhook("demo", "msg_2")
    first = await claims.claim(runtime.durable, key, 60)
    assert await claims.release(runtime.durable, first)
    assert await claims.state(runtime.durable, key) is None
    assert (await claims.claim(runtime.durable, key, 60)).claimed


async def test_release_does_not_drop_someone_elses_claim(runtime: Runtime) -> None:
    key = keys.dedup_webhook("demo", "msg_3")
    stale = await claims.claim(runtime.durable, key, 60)
    await runtime.durable.delete(key)  # the claim expired...
    fresh = await claims.claim(runtime.durable, key, 60)  # ...and a retry took it
    assert fresh.claimed
    assert not await claims.release(runtime.durable, stale)
    assert await claims.state(runtime.durable, key) == claims.IN_PROGRESS


async def test_fifty_concurrent_claims_one_winner(runtime: Runtime) -> None:
    key = keys.dedup_webhook("demo", "msg_4")
    results = await asyncio.gather(*(claims.claim(runtime.durable, key, 60) for _ in range(50)))
    assert sum(r.claimed for r in results) == 1
