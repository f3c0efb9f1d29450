"""A value read from a store at most every ``interval`` seconds, however many callers ask:
concurrent callers share one read, and a read that fails keeps the last value (the store
that failed answers the request itself). Maintenance mode and memory admission read this
way on every request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Refreshed(Generic[T]):
    def __init__(self, read: Callable[[], Awaitable[T]], initial: T, interval: float) -> None:
        self._read = read
        self.value = initial
        self.interval = interval
        self.reads = 0  # reads made, for tests and operators
        self._read_at = float("-inf")
        self._reading: asyncio.Future[T] | None = None

    @property
    def fresh(self) -> bool:
        """The value is recent enough to use without ``get`` (the caller's hot path may
        then skip a coroutine's cost)."""
        return time.monotonic() - self._read_at < self.interval

    async def get(self) -> T:
        if time.monotonic() - self._read_at < self.interval:
            return self.value
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._read())
            self.reads += 1
        try:
            self.value = await asyncio.shield(self._reading)
        except Exception:  # the last known value stands
            pass
        self._read_at = time.monotonic()
        return self.value
