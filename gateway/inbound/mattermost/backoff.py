"""Reconnect delays: exponential growth with jitter, reset after a healthy connection.

Written here rather than taken from ``backoff``/``tenacity``: those wrap a call that fails, while
the listener's loop also needs "the connection was healthy long enough, start over from the
initial delay", which is two lines on a tiny class and awkward through a retry decorator.
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """``next()`` gives ``d * U(0.5, 1)`` with ``d`` doubling up to ``maximum`` ("equal jitter":
    replicas that lost the server together do not come back in lock-step, yet the delay never
    collapses to zero and hammers a server that is down)."""

    def __init__(self, initial: float, maximum: float,
                 rng: Callable[[], float] = random.random) -> None:
        self.initial = initial
        self.maximum = max(initial, maximum)
        self._rng = rng
        self._current = initial

    def next(self) -> float:
        delay = self._current * (0.5 + self._rng() / 2)
        self._current = min(self._current * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._current = self.initial
