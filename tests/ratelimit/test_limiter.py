"""The rl: limiter against the real redis-durable: exact windows on a simulated clock, Redis
time on the production path, weighted costs, concurrency slots."""

from __future__ import annotations

import asyncio
import bisect
import time

import pytest

from gateway import keys
from gateway.outbound.delivery import admit
from gateway.ratelimit import Limiter, LimitError, Rate
from gateway.ratelimit.limiter import window_key
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.runtime import Runtime
from tests.helpers import registry_violations


def max_in_any_window(times: list[float], period: float) -> int:
    """The most admissions inside any half-open interval [t, t + period)."""
    times = sorted(times)
    return max((bisect.bisect_left(times, t + period) - i for i, t in enumerate(times)),
               default=0)


async def test_thousand_attempts_over_a_simulated_minute_never_exceed_the_limit(
        runtime: Runtime) -> None:
    limiter = Limiter(runtime.durable)
    start = 1_000_000.0
    admitted: list[float] = []
    # 1,000 attempts spread over 60 s, with clusters right at the window edges (t = 0, 60 s).
    instants = [start + i * 0.06 for i in range(900)]
    instants += [start + 59.999 + i * 0.00001 for i in range(50)]
    instants += [start + 60.0 + i * 0.00001 for i in range(50)]
    for now in sorted(instants):
        decision = await limiter.check("sim", rate=100, period=60.0, burst=100, now=now)
        if decision.admitted:
            admitted.append(now)
    assert max_in_any_window(admitted, 60.0) <= 100
    # The limit is reached (not just respected): the whole first window's budget was used,
    # and a fresh window's budget opened exactly one period after the first admission.
    assert sum(1 for t in admitted if t < start + 60.0) == 100
    assert any(t >= start + 60.0 for t in admitted)


async def test_a_fractional_rate_is_kept_on_average_not_truncated_to_zero(
        runtime: Runtime) -> None:
    """0.5 per second admits one unit every two seconds (int(0.5) would admit nothing)."""
    limiter = Limiter(runtime.durable)
    base = 7_000_000.0
    first = await limiter.check("half", rate=0.5, period=1.0, now=base)
    early = await limiter.check("half", rate=0.5, period=1.0, now=base + 1.0)
    due = await limiter.check("half", rate=0.5, period=1.0, now=base + 2.0)
    assert first.admitted and not early.admitted and due.admitted
    assert early.wait == pytest.approx(1.0, abs=1e-6)
    admitted = [t for t in (base + 3 + i * 0.1 for i in range(100))
                if (await limiter.check("three-halves", rate=1.5, period=1.0, burst=2,
                                        now=t)).admitted]
    # 1.5/s is 2 per 4/3 s: never more in any such window, and about 15 in 10 s.
    assert max_in_any_window(admitted, 4 / 3) <= 2 and 14 <= len(admitted) <= 16


async def test_a_fixed_window_edge_burst_is_refused(runtime: Runtime) -> None:
    """The classic INCR+EXPIRE failure: a full budget at the end of one window and another
    at the start of the next. The sliding window refuses the second. (A 60 s window: the
    log's keys expire after a window of real time whatever the simulated clock says, and
    twenty calls on a loaded machine took longer than a 1 s one.)"""
    limiter = Limiter(runtime.durable)
    base = 6_000_000.0  # a multiple of 60: a fixed window would end at base + 60
    first = [await limiter.check("edge", rate=10, period=60.0, burst=10, now=base + 59.99)
             for _ in range(10)]
    second = [await limiter.check("edge", rate=10, period=60.0, burst=10, now=base + 60.01)
              for _ in range(10)]
    assert all(d.admitted for d in first)
    assert not any(d.admitted for d in second)
    # The refusal says when the oldest admission leaves the window.
    assert second[0].wait == pytest.approx(59.98, abs=1e-6)


async def test_burst_one_spaces_attempts_evenly(runtime: Runtime) -> None:
    limiter = Limiter(runtime.durable)
    base = 7_000_000.0
    assert (await limiter.check("smooth", rate=30, period=1.0, now=base)).admitted
    refused = await limiter.check("smooth", rate=30, period=1.0, now=base + 0.01)
    assert not refused.admitted
    assert refused.wait == pytest.approx(1 / 30 - 0.01, abs=1e-5)
    assert (await limiter.check("smooth", rate=30, period=1.0, now=base + 1 / 30)).admitted


async def test_weighted_costs_count_tokens(runtime: Runtime) -> None:
    limiter = Limiter(runtime.durable)
    base = 9_000_000.0
    tokens = dict(rate=1000, period=60.0, burst=1000)
    assert (await limiter.check("tok", cost=600, now=base, **tokens)).admitted
    refused = await limiter.check("tok", cost=500, now=base + 1, **tokens)
    assert not refused.admitted and refused.wait == pytest.approx(59.0)
    assert (await limiter.check("tok", cost=400, now=base + 1, **tokens)).admitted
    with pytest.raises(LimitError):
        await limiter.check("tok", cost=1001, now=base + 2, **tokens)


async def test_production_path_uses_redis_time_and_waits(runtime: Runtime) -> None:
    limiter = Limiter(runtime.durable)
    redis_now = float((await runtime.durable.time())[0])
    decision = await limiter.check("real", rate=5, period=0.5)
    assert decision.admitted
    assert abs(decision.now - redis_now) < 5  # Redis's clock, not a test-chosen one
    started = time.monotonic()
    for _ in range(6):  # five per 0.5 s spaced evenly: the sixth needs ~0.5 s of waiting
        await limiter.acquire("real2", rate=5, period=0.5)
    assert time.monotonic() - started >= 0.35
    ttl = await runtime.durable.pttl(window_key("real2"))
    assert 0 < ttl <= 1000  # the key lives one window, not forever
    assert await registry_violations(runtime.durable, "durable") == []


async def test_concurrent_acquirers_share_one_budget(runtime: Runtime) -> None:
    """Many coroutines racing on one name (as replicas would) get no more than the limit."""
    limiter = Limiter(runtime.durable)

    async def attempts() -> list[float]:
        return [await limiter.try_acquire("race", rate=20, period=30.0, burst=20)
                for _ in range(20)]

    # The first command outside the race: redis-py's cluster client initialises lazily, and
    # ten first commands at once make it re-initialise under their feet (a client issue).
    await limiter.check("warm-up", rate=1, period=1.0)
    # 10 racers: enough to interleave; a storm of new connections is not what is tested here.
    results = [w for batch in await asyncio.gather(*(attempts() for _ in range(10)))
               for w in batch]
    assert len(results) == 200
    assert sum(1 for wait in results if wait == 0) == 20


async def test_concurrency_slots(runtime: Runtime) -> None:
    limiter = Limiter(runtime.durable)
    base = 11_000_000.0
    assert await limiter.try_slot("llm", "a", limit=2, lease=10, now=base) == 0
    assert await limiter.try_slot("llm", "b", limit=2, lease=10, now=base + 1) == 0
    assert await limiter.try_slot("llm", "c", limit=2, lease=10, now=base + 2) == pytest.approx(8)
    await limiter.release_slot("llm", "a")
    assert await limiter.try_slot("llm", "c", limit=2, lease=10, now=base + 2) == 0
    # A crashed holder's lease runs out: its slot comes back without a release.
    assert await limiter.try_slot("llm", "d", limit=2, lease=10, now=base + 11.5) == 0


async def test_ended_leases_are_dropped_when_the_slots_fill(runtime: Runtime) -> None:
    """An ended lease stays until the slots look full (while there is room, one ZCARD
    answers), then counts for nothing: the members never exceed the limit."""
    limiter = Limiter(runtime.durable)
    slots, base = keys.rl("slots", "lazy"), 12_000_000.0
    assert await limiter.try_slot("lazy", "a", limit=2, lease=10, now=base) == 0
    assert await limiter.try_slot("lazy", "b", limit=2, lease=10, now=base + 11) == 0
    assert await runtime.durable.zcard(slots) == 2  # a's ended lease is still there
    assert await limiter.try_slot("lazy", "c", limit=2, lease=10, now=base + 12) == 0
    assert sorted(await runtime.durable.zrange(slots, 0, -1)) == ["b", "c"]
    # full of live leases: the next waits for b's to end (base + 21)
    assert await limiter.try_slot("lazy", "d", limit=2, lease=10,
                                  now=base + 13) == pytest.approx(8)


async def test_slot_context_bounds_parallel_calls(runtime: Runtime) -> None:
    limiter = Limiter(runtime.durable)
    await limiter.release_slot("par", "nobody")  # first command outside the race (cluster)
    running = peak = 0

    async def call() -> None:
        nonlocal running, peak
        async with limiter.slot("par", limit=3, poll=0.005):
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.02)
            running -= 1

    await asyncio.gather(*(call() for _ in range(12)))
    assert peak == 3
    assert await runtime.durable.zcard(keys.rl("slots", "par")) == 0


async def test_running_total_follows_expiry_and_survives_loss(runtime: Runtime) -> None:
    limiter = Limiter(runtime.durable)
    base = 13_000_000.0
    spec = dict(rate=5, period=10.0, burst=5)
    total = window_key("tot") + ":total"
    for i in range(3):
        assert (await limiter.check("tot", now=base + i, **spec)).admitted
    await runtime.durable.delete(total)  # lost: recomputed from the log, not reset to zero
    assert [(await limiter.check("tot", now=base + 3 + i, **spec)).admitted
            for i in range(3)] == [True, True, False]
    assert await runtime.durable.get(total) == "5"
    assert (await limiter.check("tot", now=base + 10.5, **spec)).admitted  # base+0 expired
    assert await runtime.durable.get(total) == "5"
    assert 0 < await runtime.durable.pttl(total) <= 11_000


async def test_a_retried_attempt_is_counted_once(runtime: Runtime) -> None:
    """redis-py retries a command whose connection broke; if the script had run, the retry
    must not count the cost twice (same attempt id)."""
    limiter = Limiter(runtime.durable)
    script = limiter._window
    key = window_key("retry")
    args = [5, 10_000_000, 5, 10_000_000, 2, "attempt-1", "20000000000000"]
    assert (await script(keys=[key, key + ":total"], args=args))[0] == 1
    assert (await script(keys=[key, key + ":total"], args=args))[0] == 1  # the retry
    assert await runtime.durable.get(key + ":total") == "2"
    assert await runtime.durable.zcard(key) == 1


async def test_a_send_asks_every_bucket_at_once_and_gives_back_a_partial_admission(
        runtime: Runtime) -> None:
    """``admit``'s first try asks both buckets in one round trip; when the chat's refuses,
    the bot's unit of that try is given back, and the buckets are then taken one after the
    other as before (the bot's, then the chat's after its wait): one unit each per send."""
    auto = AutoPipeline(runtime.durable)
    limiter = Limiter(runtime.durable, auto)
    bot, chat = Rate(1000, 60.0, 1000), Rate(1, 2.0)
    limits = [("gb:bot", bot), ("gb:chat", chat)]
    await limiter.check("gb:warm", rate=1, period=1.0)  # the script loaded once
    flushes = auto.flushes
    await admit(limiter, limits)
    assert auto.flushes == flushes + 1  # both buckets, one round trip
    assert await runtime.durable.zcard(window_key("gb:bot")) == 1
    waiting = asyncio.create_task(admit(limiter, limits))
    await asyncio.sleep(0.5)  # the chat's 2 s interval is not over: still waiting
    assert not waiting.done()
    async with asyncio.timeout(10):
        await waiting
    # Two sends, two units in the bot's log: the given-back unit of the refused try is gone.
    assert await runtime.durable.zcard(window_key("gb:bot")) == 2
    assert await runtime.durable.get(window_key("gb:bot") + ":total") in (b"2", "2")
    decisions = await limiter.check_each([("gb:chat", 1, 60.0, 1), ("gb:other", 1, 60.0, 1)])
    assert [d.admitted for d in decisions] == [False, True]
