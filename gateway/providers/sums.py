"""Today's token sums of chats and accounts, as budget checks read them: from PostgreSQL at
most every ``interval`` seconds per key and process, this process's own calls added as they
are recorded. The sums stay what they were (SQL over the usage rows); only how often they are
read changes, so a check costs no statement while its sums are fresh.

Staleness is bounded: a sum misses at most the calls of the last ``interval`` seconds
(other processes', and rarely this one's: see ``add``) and, as before, the calls in
flight. ``interval`` 0 reads every call.
Concurrent checks share reads (the stale keys of one event-loop turn go in one statement);
at most ``MAX_KEYS`` keys are kept (the oldest read is forgotten first), so a flood of chat
keys cannot grow the cache without bound.
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
    def __init__(self, read: Callable[[list[str], list[str]], Awaitable[dict[Key, int]]],
                 interval: float) -> None:
        """``read(chats, accounts)``: the sums of all of them in one statement (a key
        without rows today may be left out: it counts 0)."""
        self._read = read
        self.interval = interval
        self.reads = 0  # statements made, for tests and the bench
        self._sums: dict[Key, _Sum] = {}
        self._reading: dict[Key, asyncio.Future[None]] = {}
        self._batch: list[Key] | None = None  # keys of the read about to go out
        self._batch_read: asyncio.Future[None] | None = None

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

    def cached(self, chat: str | None, account: str | None
               ) -> tuple[int | None, int | None] | None:
        """``get``'s answer when no read is needed (both sums fresh), else None: the
        caller's hot path skips a coroutine."""
        now = time.monotonic()
        chat_used = account_used = None
        if chat is not None and (chat_used := self._fresh(("chat", chat), now)) is None:
            return None
        if account is not None and (
                account_used := self._fresh(("account", account), now)) is None:
            return None
        return chat_used, account_used

    def _value(self, key: Key) -> int:
        found = self._sums.get(key)
        return 0 if found is None else found.value

    async def _refresh(self, stale: list[Key]) -> None:
        """Join the read under way for a key, or the one about to go out: the stale keys of
        every check in one turn of the event loop are read by one statement."""
        for key in stale:
            if key in self._reading:
                continue
            if self._batch is None or self._batch_read is None:
                self._batch = []
                self._batch_read = asyncio.ensure_future(self._read_batch())
            self._batch.append(key)
            self._reading[key] = self._batch_read
        for future in {self._reading[key] for key in stale if key in self._reading}:
            await asyncio.shield(future)

    async def _read_batch(self) -> None:
        await asyncio.sleep(0)  # the checks of this turn join the batch
        keys, self._batch, self._batch_read = self._batch or [], None, None
        try:
            self.reads += 1
            found = await self._read([name for kind, name in keys if kind == "chat"],
                                     [name for kind, name in keys if kind == "account"])
            now = time.monotonic()
            for key in keys:
                self._sums.pop(key, None)  # re-inserted last: the oldest read goes first
                self._sums[key] = _Sum(found.get(key, 0), now)
            while len(self._sums) > MAX_KEYS:
                del self._sums[next(iter(self._sums))]
        finally:
            for key in keys:
                self._reading.pop(key, None)

    def add(self, chat: str | None, account: str | None, tokens: int) -> None:
        """A call of this process was recorded: its tokens count at once, not at the next
        read. (A read under way meanwhile may count them twice until the next read, which
        only refuses early, or, when its snapshot missed the row, replace them with the
        older sum: within the staleness stated above.)"""
        for kind, name in (("chat", chat), ("account", account)):
            found = self._sums.get((kind, name)) if name is not None else None
            if found is not None:
                found.value += tokens
