"""1,000 calls through the chain against one fake provider with small limits: the requests,
tokens and concurrency the fake saw never exceed them in any window, and each limit is
reached (so the test is at the window edges, not below them). Asserted from the fake's own
record: arrival times, the tokens it counted, the most requests it served at once."""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Sequence

from gateway.providers import Chain
from tests.fakes.base import Call
from tests.fakes.openai import FakeOpenAI, fake_tokens
from tests.providers.conftest import MakeProviders

WINDOW = 0.2          # seconds: requests_per_minute and tokens_per_minute count per WINDOW
REQUESTS = 40
TOKENS = 200
CONCURRENT = 4
# Admission is on Redis time, arrival on the fake's: a request admitted late in one window
# may arrive a little after one admitted early in the next. Checked over windows this much
# shorter, a limiter letting a window's budget through twice would still be caught.
SLACK = WINDOW / 4


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


async def test_1000_calls_never_exceed_requests_tokens_or_concurrency(
        fake_openai: FakeOpenAI, make_providers: MakeProviders) -> None:
    fake_openai.delay = 0.005  # calls overlap, so concurrency is contended
    chain = make_providers(("a", fake_openai), requests_per_minute=REQUESTS,
                           tokens_per_minute=TOKENS, concurrent=CONCURRENT,
                           window_seconds=WINDOW).chain(["a"])
    # 600 one-token calls: the request limit binds. Then 400 calls of ten 4-letter words,
    # estimated at 13 tokens and counted by the provider at 10 (the limiter is corrected to
    # 10 after each): the token limit binds.
    await run(chain, [["tiny"]] * 600)
    await run(chain, [["word " * 9 + "word"]] * 400)

    calls = sorted(fake_openai.calls_to("embeddings"), key=lambda c: c.time)
    assert len(calls) == 1000
    light, heavy = calls[:600], calls[600:]
    assert all(c.params["input"] == ["tiny"] for c in light)

    assert most_in_any_window(calls, WINDOW - SLACK) <= REQUESTS
    assert most_in_any_window(light, WINDOW) >= REQUESTS * 0.9
    assert most_in_any_window(heavy, WINDOW - SLACK, weight=True) <= TOKENS
    assert most_in_any_window(heavy, WINDOW, weight=True) >= TOKENS * 0.9
    assert fake_openai.max_in_flight == CONCURRENT
    # Nothing went faster than the limits allow overall either.
    assert calls[599].time - calls[0].time >= (600 / REQUESTS - 1) * WINDOW
    assert calls[-1].time - heavy[0].time >= (4000 / TOKENS - 1) * WINDOW
