"""Feed rows for the subscriptions a process holds: each row fetched once, whatever the
number of subscriptions that deliver it.

A small row rides in its push signal and is kept from there; otherwise the first
subscription to need a topic's rows after an offset reads a page of them, and every other
one asking for the same position waits for that read instead of making its own. Rows are
kept in a bounded cache (the oldest go first), so 1,000 subscriptions on one topic cost one
read per page, not 1,000.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import asyncpg

from gateway.push import feed
from gateway.push.protocol import FeedRow

PAGE_ROWS = 200
CACHE_ROWS = 20_000


class Rows:
    def __init__(self, pool: asyncpg.Pool, capacity: int = CACHE_ROWS) -> None:
        self.pool = pool
        self.capacity = capacity
        self._rows: OrderedDict[tuple[str, int], FeedRow] = OrderedDict()
        self._reads: dict[tuple[str, int], asyncio.Task[FeedRow | None]] = {}
        self.reads = 0  # pages read from PostgreSQL (the bench and tests look)

    def offer(self, row: FeedRow) -> None:
        """Keep a row that arrived with its signal."""
        self._keep(row)

    def _keep(self, row: FeedRow) -> None:
        key = (row.topic, row.offset)
        if key in self._rows:
            self._rows.move_to_end(key)
        self._rows[key] = row
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)

    async def after(self, topic: str, offset: int, epoch: int | None) -> FeedRow | None:
        """The first row of ``topic`` after ``offset`` (in ``epoch`` when it is cached; a
        read answers the topic's current epoch, which the caller compares), or None."""
        cached = self._rows.get((topic, offset + 1))
        if cached is not None and (epoch is None or cached.epoch == epoch):
            return cached
        key = (topic, offset)
        task = self._reads.get(key)
        if task is None:
            task = self._reads[key] = asyncio.create_task(self._read(topic, offset))
            task.add_done_callback(lambda _: self._reads.pop(key, None))
        return await asyncio.shield(task)

    async def _read(self, topic: str, offset: int) -> FeedRow | None:
        self.reads += 1
        page = await feed.read_page(self.pool, topic, offset, PAGE_ROWS)
        for row in page.rows:
            self._keep(row)
        return page.rows[0] if page.rows else None
