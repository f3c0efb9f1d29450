"""In-process FIFO locks by key, dropped when nobody holds or waits for them.

The PostgreSQL advisory lock already serialises a chat across processes; this lock comes
first so that a burst of messages to one chat waits here (in arrival order, as asyncio.Lock
wakes waiters first-in first-out) instead of each holding a pool connection while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class KeyedLocks:
    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)
