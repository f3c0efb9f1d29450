"""``feed.append_many``: one statement per batch, same offset guarantees as ``append``."""

from __future__ import annotations

import asyncio
import random

import pytest

from gateway.push import feed
from gateway.stores.runtime import Runtime
from tests.push.polling import follow_while


async def test_a_block_gets_consecutive_offsets_in_the_given_order(runtime: Runtime) -> None:
    await feed.append_and_publish(runtime.pg, runtime.cache, "pipeline", "store", {"n": 0})
    async with runtime.pg.acquire() as conn, conn.transaction():
        block = await feed.append_many(
            conn, "pipeline", [("chunk", {"n": 1}), ("embed", {"n": 2}), ("graph", {"n": 3})])
    assert [(r.offset, r.kind, r.payload) for r in block] == [
        (2, "chunk", {"n": 1}), (3, "embed", {"n": 2}), (4, "graph", {"n": 3})]
    single = await feed.append_and_publish(runtime.pg, runtime.cache, "pipeline", "store", {})
    assert single.offset == 5
    page = await feed.read_page(runtime.pg, "pipeline", 0, 10)
    assert page.last_offset == 5
    assert [(r.offset, r.kind, r.payload) for r in page.rows[1:4]] == [
        (2, "chunk", {"n": 1}), (3, "embed", {"n": 2}), (4, "graph", {"n": 3})]
    assert page.rows[2].wire == block[1].wire  # what a signal carries = what a read returns


async def test_first_block_of_a_new_topic_starts_at_one(runtime: Runtime) -> None:
    async with runtime.pg.acquire() as conn, conn.transaction():
        block = await feed.append_many(conn, "conversation:new", [("m", {})] * 4)
    assert [r.offset for r in block] == [1, 2, 3, 4]
    assert {r.epoch for r in block} == {1}


async def test_empty_block_and_bad_rows_write_nothing(runtime: Runtime) -> None:
    async with runtime.pg.acquire() as conn, conn.transaction():
        assert await feed.append_many(conn, "pipeline", []) == []
        with pytest.raises(feed.FeedError):
            await feed.append_many(conn, "pipeline", [("ok", {}), ("bad\nkind", {})])
        with pytest.raises(feed.FeedError):
            await feed.append_many(conn, "pipeline", [("ok", ["not", "an", "object"])])  # type: ignore[list-item]
        with pytest.raises(feed.FeedError):
            await feed.append_many(conn, "bad topic", [("ok", {})])
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed") == 0
    assert (await feed.heads(runtime.pg, ["pipeline"]))["pipeline"].last_offset == 0


async def test_rolled_back_block_leaves_no_hole(runtime: Runtime) -> None:
    async with runtime.pg.acquire() as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await feed.append_many(conn, "pipeline", [("store", {})] * 5)
                raise RuntimeError("caller failed after appending")
    row = await feed.append_and_publish(runtime.pg, runtime.cache, "pipeline", "store", {})
    assert row.offset == 1


async def test_concurrent_blocks_and_singles_leave_no_hole_a_poller_skips(
        runtime: Runtime) -> None:
    """Writers mix blocks of 1-9 rows and single appends and hold their commit back a
    random while; a poller advancing its cursor to the highest offset it saw must still see
    every offset, each row exactly once, each block contiguous."""
    writers, rounds = 6, 12
    written = 0

    async def writer(n: int) -> None:
        nonlocal written
        rng = random.Random(n)
        for i in range(rounds):
            size = rng.randint(1, 9)
            async with runtime.pg.acquire() as conn, conn.transaction():
                if size == 1:
                    await feed.append(conn, "pipeline", "one", {"w": n, "i": i, "k": 0})
                else:
                    await feed.append_many(conn, "pipeline", [
                        ("many", {"w": n, "i": i, "k": k}) for k in range(size)])
                await asyncio.sleep(rng.random() * 0.005)
            written += size

    seen = await follow_while(runtime, "pipeline",
                              asyncio.gather(*(writer(n) for n in range(writers))))
    assert [r.offset for r in seen] == list(range(1, written + 1))
    # Each transaction's rows are contiguous and in the order given.
    by_txn: dict[tuple[int, int], list[int]] = {}
    for row in seen:
        by_txn.setdefault((row.payload["w"], row.payload["i"]), []).append(row.offset)
        assert row.offset - by_txn[row.payload["w"], row.payload["i"]][0] == row.payload["k"]
    assert len(by_txn) == writers * rounds
