"""A poller that follows a topic the way a client does: read ``offset > cursor``, move the
cursor to the highest offset seen. Concurrent-writer tests check that it still sees every
offset, which it would not if a row could become visible before a lower one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from gateway.push import feed
from gateway.stores.runtime import Runtime


async def follow_while(runtime: Runtime, topic: str, writers: Awaitable[object],
                       timeout: float = 30.0) -> list[feed.FeedRow]:
    """Every row the poller saw while ``writers`` ran, and until a read after they finished
    comes back empty."""
    finished = asyncio.Event()
    seen: list[feed.FeedRow] = []

    async def poller() -> None:
        cursor = 0
        while True:
            last_round = finished.is_set()
            _, rows = await feed.read(runtime.pg, topic, cursor, 1000)
            seen.extend(rows)
            if rows:
                cursor = rows[-1].offset
            if last_round and not rows:
                return
            await asyncio.sleep(0.001)

    poll = asyncio.create_task(poller())
    try:
        await writers
    finally:
        finished.set()
    async with asyncio.timeout(timeout):
        await poll
    return seen
