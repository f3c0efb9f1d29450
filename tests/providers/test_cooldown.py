"""A provider's 429 with ``Retry-After`` holds back every caller, not only the one that got it:
its cool-down is kept in ``rl:`` and read by the limiter's admission script, so two
replicas' clients (two ``ModelProviders`` on one Redis) send nothing to the provider until it
is over; a cool-down longer than ``max_retry_after_seconds`` sends callers on to the next
provider without a call."""

from __future__ import annotations

import asyncio

import pytest

from gateway.providers import Charge
from gateway.ratelimit import CoolingDown, Limiter, Window
from gateway.ratelimit.limiter import cooldown_key
from gateway.stores.runtime import Runtime
from tests.fakes.openai import FakeOpenAI
from tests.fakes.pytest_plugin import OPENAI_KEY
from tests.providers.conftest import MakeProviders

RETRY_AFTER = 2


async def test_after_a_429_no_replica_calls_the_provider_until_retry_after_is_over(
        fake_openai: FakeOpenAI, make_providers: MakeProviders) -> None:
    # One call at a time: the second replica's caller waits for the first's slot, which is
    # given back right after its 429, so without a shared cool-down it would call at once.
    replicas = [make_providers(("a", fake_openai), concurrent=1) for _ in range(2)]
    fake_openai.fail("embeddings", 429, retry_after=RETRY_AFTER)
    results = await asyncio.gather(*(
        providers.chain(["a"]).embeddings("e", [f"text {i}"], charge=Charge(job=f"j{i}"))
        for i, providers in enumerate(replicas)))
    assert all(result.provider == "a" for result in results)
    first, *later = sorted(fake_openai.calls_to("embeddings"), key=lambda c: c.time)
    assert len(later) == 2  # the 429'd caller's retry and the other replica's call
    gaps = [call.time - first.time for call in later]
    assert min(gaps) >= RETRY_AFTER, f"called {min(gaps):.3f} s after the 429"


async def test_a_cool_down_beyond_the_wait_bound_moves_on_without_calling(
        fake_openai: FakeOpenAI, make_providers: MakeProviders) -> None:
    async with FakeOpenAI(api_key=OPENAI_KEY) as second:
        replicas = [make_providers(("a", fake_openai), ("b", second),
                                   max_retry_after_seconds=5) for _ in range(2)]
        fake_openai.fail("chat", 429, retry_after=60)
        hello = [{"role": "user", "content": "hello"}]
        assert (await replicas[0].chain(["a", "b"]).chat("m", hello)).provider == "b"
        # The other replica goes straight to b: a says it is busy for a minute.
        assert (await replicas[1].chain(["a", "b"]).chat("m", hello)).provider == "b"
        assert len(fake_openai.calls_to("chat")) == 1
        assert len(second.calls_to("chat")) == 2


async def test_the_cool_down_is_read_by_the_admission_script(runtime: Runtime) -> None:
    limiter = Limiter(runtime.durable)
    window = [Window("requests", 100, 60.0, 1)]
    await limiter.cool_down("provider:x", 1.5, now=1000.0)
    key = cooldown_key("provider:x")
    assert key.startswith("rl:") and 0 < await runtime.durable.pttl(key) <= 1500
    held = await limiter.check_all("provider:x", window, attempt="a", now=1000.5,
                                   cooldown=True)
    assert not held.admitted and held.cooling and abs(held.wait - 1.0) < 1e-6
    # A shorter cool-down later does not cut it short; callers that do not ask ignore it.
    await limiter.cool_down("provider:x", 0.1, now=1000.6)
    assert (await limiter.check_all("provider:x", window, attempt="b", now=1001.2,
                                    cooldown=True)).cooling
    assert (await limiter.check_all("provider:x", window, attempt="c", now=1001.2)).admitted
    assert (await limiter.check_all("provider:x", window, attempt="d", now=1001.5,
                                    cooldown=True)).admitted
    await limiter.cool_down("provider:y", 30)  # on Redis time, as callers wait
    with pytest.raises(CoolingDown) as cooling:
        await limiter.acquire_all("provider:y", window, cooldown=True, max_cooldown=5)
    assert 25 < cooling.value.seconds <= 30
