"""A dict that keeps at most ``size`` entries, dropping the oldest written: the per-process
caches of the credential check (verified tokens, API-key rows, revocation reads) hold what
clients present, so none may grow with it. ``Fresh`` adds an age: a value read at most once
per ``seconds`` per key (the revocation marks every replica must see within that bound)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Bounded(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class Fresh(Generic[K, V]):
    """Per key, the value ``read`` gave at most ``seconds`` ago, else a new read; at most
    ``size`` keys kept."""

    def __init__(self, seconds: float, size: int) -> None:
        self.seconds = seconds
        self._items: Bounded[K, tuple[float, V]] = Bounded(size)

    async def get(self, key: K, read: Callable[[], Awaitable[V]]) -> V:
        now = time.monotonic()
        cached = self._items.get(key)
        if cached is not None and now - cached[0] < self.seconds:
            return cached[1]
        value = await read()
        self._items.put(key, (now, value))
        return value

    def put(self, key: K, value: V) -> None:
        """What this process wrote itself: served as read now."""
        self._items.put(key, (time.monotonic(), value))
