"""1,000 calls through the chain against one fake provider with small limits: the requests,
tokens and concurrency the fake saw never exceed them in any window, and each limit is
reached (so the test is at the window edges, not below them). Asserted from the fake's own
record: arrival times, the tokens it counted, the most requests it served at once."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import AsyncIterator, Sequence

from gateway.providers import Chain
from tests.fakes.base import Call
from tests.fakes.openai import FakeOpenAI, fake_tokens
from tests.providers.conftest import MakeProviders

WINDOW = 0.2          # seconds: requests_per_minute and tokens_per_minute count per WINDOW
REQUESTS = 40
TOKENS = 200
CONCURRENT = 4
# Admission is on Redis time, arrival on the fake's: a request admitted in one window and
# delayed on its way (this process busy or descheduled: other test runs share the 2 cores)
# may arrive beside the next window's, as a real provider would see it. So the limits are
# checked over windows shorter by the worst delay this run had (twice the event loop's
# largest lag, at least WINDOW / 4, at most WINDOW / 2): a limiter letting a window's budget
# through twice, or sending requests long after their admission, is still caught.


def most_in_any_window(calls: Sequence[Call], span: float, weight: bool = False) -> int:
    """The most requests (or tokens, ``weight``) that arrived within any [t, t + span)."""
    times = [c.time for c in calls]
    costs = [sum(fake_tokens(t) for t in c.params["input"]) if weight else 1 for c in calls]
    prefix = [0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    return max(prefix[bisect.bisect_left(times, t + span)] - prefix[i]
               for i, t in enumerate(times))


async def run(chain: Chain, inputs: list[list[str]], workers: int = 12) -> None:
    queue = list(reversed(inputs))

    async def worker() -> None:
        while queue:
            await chain.embeddings("e", queue.pop())

    await asyncio.gather(*(worker() for _ in range(workers)))


@contextlib.asynccontextmanager
async def loop_lag() -> AsyncIterator[list[float]]:
    """Yields [largest lag]: how much later than asked a 5 ms sleep woke, at worst."""
    worst = [0.0]
    loop = asyncio.get_running_loop()

    async def watch() -> None:
        while True:
            started = loop.time()
            await asyncio.sleep(0.005)
            worst[0] = max(worst[0], loop.time() - started - 0.005)

    task = asyncio.create_task(watch())
    try:
        yield worst
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_1000_calls_never_exceed_requests_tokens_or_concurrency(
        fake_openai: FakeOpenAI, make_providers: MakeProviders) -> None:
    fake_openai.delay = 0.005  # calls overlap, so concurrency is contended
    chain = make_providers(("a", fake_openai), requests_per_minute=REQUESTS,
                           tokens_per_minute=TOKENS, concurrent=CONCURRENT,
                           window_seconds=WINDOW).chain(["a"])
    # 600 one-token calls: the request limit binds. Then 400 calls of ten 4-letter words,
    # estimated at 13 tokens and counted by the provider at 10 (the limiter is corrected to
    # 10 after each): the token limit binds.
    async with loop_lag() as lag:
        await run(chain, [["tiny"]] * 600)
        await run(chain, [["word " * 9 + "word"]] * 400)
    span = WINDOW - min(WINDOW / 2, max(WINDOW / 4, 2 * lag[0]))

    calls = sorted(fake_openai.calls_to("embeddings"), key=lambda c: c.time)
    assert len(calls) == 1000
    light, heavy = calls[:600], calls[600:]
    assert all(c.params["input"] == ["tiny"] for c in light)

    assert most_in_any_window(calls, span) <= REQUESTS, f"loop lag up to {lag[0]:.3f} s"
    assert most_in_any_window(light, WINDOW) >= REQUESTS * 0.9
    assert most_in_any_window(heavy, span, weight=True) <= TOKENS, f"lag {lag[0]:.3f} s"
    assert most_in_any_window(heavy, WINDOW, weight=True) >= TOKENS * 0.9
    assert fake_openai.max_in_flight == CONCURRENT
    # Nothing went faster than the limits allow overall either.
    assert calls[599].time - calls[0].time >= (600 / REQUESTS - 1) * WINDOW
    assert calls[-1].time - heavy[0].time >= (4000 / TOKENS - 1) * WINDOW
