"""Today's token sums of chats and accounts, as budget checks read them: from PostgreSQL at
most every ``interval`` seconds per key and process, this process's own calls added as they
are recorded. The sums stay what they were (SQL over the usage rows); only how often they are
read changes, so a check costs no statement while its sums are fresh.

Staleness is bounded: a sum misses at most the other processes' calls of the last
``interval`` seconds (and, as before, the calls in flight). ``interval`` 0 reads every call.
Concurrent checks of one key share one read; at most ``MAX_KEYS`` keys are kept (the oldest
read is forgotten first), so a flood of chat keys cannot grow the cache without bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

MAX_KEYS = 10_000
Key = tuple[str, str]  # ("chat" | "account", its key)


@dataclass
class _Sum:
    value: int
    read_at: float


class Sums:
    def __init__(self, read: Callable[[str | None, str | None], Awaitable[tuple[int | None,
                                                                               int | None]]],
                 interval: float) -> None:
        """``read(chat, account)``: both sums in one statement (None for a key not asked)."""
        self._read = read
        self.interval = interval
        self.reads = 0  # statements made, for tests and the bench
        self._sums: dict[Key, _Sum] = {}
        self._reading: dict[Key, asyncio.Future[None]] = {}

    def _fresh(self, key: Key, now: float) -> int | None:
        found = self._sums.get(key)
        if found is None or now - found.read_at >= self.interval:
            return None
        return found.value

    async def get(self, chat: str | None, account: str | None) -> tuple[int | None, int | None]:
        """Today's sums of ``chat`` and ``account`` (None where not asked)."""
        now = time.monotonic()
        chat_key = ("chat", chat) if chat is not None else None
        account_key = ("account", account) if account is not None else None
        stale = [key for key in (chat_key, account_key)
                 if key is not None and self._fresh(key, now) is None]
        if stale:
            await self._refresh(stale)
        return (None if chat_key is None else self._value(chat_key),
                None if account_key is None else self._value(account_key))

    def _value(self, key: Key) -> int:
        found = self._sums.get(key)
        return 0 if found is None else found.value

    async def _refresh(self, stale: list[Key]) -> None:
        waiting = [self._reading[key] for key in stale if key in self._reading]
        mine = [key for key in stale if key not in self._reading]
        if mine:
            future: asyncio.Future[None] = asyncio.ensure_future(self._read_into(mine))
            for key in mine:
                self._reading[key] = future
            waiting.append(future)
        for future in waiting:
            await asyncio.shield(future)

    async def _read_into(self, keys: list[Key]) -> None:
        asked = dict(keys)
        try:
            self.reads += 1
            chat_used, account_used = await self._read(asked.get("chat"), asked.get("account"))
            now = time.monotonic()
            for key, used in zip(keys, [chat_used if kind == "chat" else account_used
                                        for kind, _ in keys], strict=True):
                if used is not None:
                    self._sums.pop(key, None)  # re-inserted last: the oldest read goes first
                    self._sums[key] = _Sum(int(used), now)
            while len(self._sums) > MAX_KEYS:
                del self._sums[next(iter(self._sums))]
        finally:
            for key in keys:
                self._reading.pop(key, None)

    def add(self, chat: str | None, account: str | None, tokens: int) -> None:
        """A call of this process was recorded: its tokens count at once, not at the next
        read (a read that was already under way may then count them twice until the next:
        an over-count, which only refuses early)."""
        for kind, name in (("chat", chat), ("account", account)):
            found = self._sums.get((kind, name)) if name is not None else None
            if found is not None:
                found.value += tokens
