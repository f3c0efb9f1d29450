"""Single-holder leases with fencing tokens, against the real redis-durable."""

from __future__ import annotations

import asyncio

from gateway.leases import lease as leases
from gateway.stores.runtime import Runtime
from tests.helpers import registry_violations, wait_until


async def test_one_holder_and_tokens_grow(runtime: Runtime) -> None:
    redis = runtime.durable
    first = await leases.acquire(redis, "job", "a", 5)
    assert first is not None and first.token == 1
    assert await leases.acquire(redis, "job", "b", 5) is None
    again = await leases.acquire(redis, "job", "a", 5)  # a retried acquire by the holder
    assert again is not None and again.token == first.token
    assert await leases.current(redis, "job") == ("a", 1)
    assert await leases.release(redis, first)
    second = await leases.acquire(redis, "job", "b", 5)
    assert second is not None and second.token == 2
    assert await registry_violations(redis, "durable") == []


async def test_a_long_lived_holder_keeps_the_fencing_counter_alive(runtime: Runtime) -> None:
    """The counter's week-long TTL runs from the last renew or re-acquire, not from the first
    acquire: otherwise one holder lasting a week would let the count restart at 1."""
    redis = runtime.durable
    lease = await leases.acquire(redis, "job", "a", 5)
    assert lease is not None
    week_ms = leases.FENCE_TTL_MS
    await redis.pexpire(leases.fence_key("job"), 1000)  # as if six days and more had passed
    assert await leases.renew(redis, lease)
    assert await redis.pttl(leases.fence_key("job")) > week_ms - 60_000
    await redis.pexpire(leases.fence_key("job"), 1000)
    assert await leases.acquire(redis, "job", "a", 5) is not None  # a retried acquire
    assert await redis.pttl(leases.fence_key("job")) > week_ms - 60_000
    forged = leases.Lease("job", "b", lease.token, 5, lease.valid_until)
    await redis.pexpire(leases.fence_key("job"), 1000)
    assert not await leases.renew(redis, forged)  # a non-holder extends nothing
    assert await redis.pttl(leases.fence_key("job")) <= 1000


async def test_only_the_holder_renews_or_releases(runtime: Runtime) -> None:
    redis = runtime.durable
    lease = await leases.acquire(redis, "job", "a", 5)
    assert lease is not None
    forged = leases.Lease("job", "b", lease.token, 5, lease.valid_until)
    stale = leases.Lease("job", "a", lease.token - 1, 5, lease.valid_until)
    assert not await leases.renew(redis, forged)
    assert not await leases.release(redis, stale)
    assert await leases.current(redis, "job") == ("a", lease.token)
    assert await leases.renew(redis, lease)
    assert 4000 < await redis.pttl(leases.lease_key("job")) <= 5000
    assert await leases.holds(redis, lease)


async def test_expired_lease_goes_to_the_next_and_the_old_holder_is_fenced(
        runtime: Runtime) -> None:
    redis = runtime.durable
    old = await leases.acquire(redis, "job", "a", 0.2)
    assert old is not None

    async def taken() -> leases.Lease | None:
        return await leases.acquire(redis, "job", "b", 5)

    new = await wait_until(taken, timeout=5, message="lease to expire and be taken")
    assert new.token > old.token
    assert not await leases.holds(redis, old)
    assert not await leases.renew(redis, old)  # a lost lease is never revived
    assert not await leases.release(redis, old)
    assert await leases.holds(redis, new)


async def test_local_deadline_fences_without_redis(runtime: Runtime) -> None:
    lease = await leases.acquire(runtime.durable, "job", "a", 5)
    assert lease is not None and lease.locally_valid()
    lease.valid_until = 0.0  # as if renewals failed until the TTL ran out
    assert not await leases.holds(runtime.durable, lease)


async def test_concurrent_acquire_has_one_winner(runtime: Runtime) -> None:
    results = await asyncio.gather(*(leases.acquire(runtime.durable, "job", f"h{i}", 5)
                                     for i in range(30)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1 and winners[0].token == 1
