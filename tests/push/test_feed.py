"""The feed on a real PostgreSQL: offsets, epochs, transactions, concurrent writers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway import keys
from gateway.push import feed
from gateway.stores.runtime import Runtime
from tests.push.polling import follow_while


async def test_append_read_and_wire_form(runtime: Runtime) -> None:
    first = await feed.append_and_publish(runtime.pg, runtime.cache, "pipeline", "store",
                                          {"item_id": "a", "stage": "store"})
    second = await feed.append_and_publish(runtime.pg, runtime.cache, "pipeline", "chunk",
                                           {"item_id": "a", "stage": "chunk"})
    assert (first.offset, second.offset) == (1, 2)
    epoch, rows = await feed.read(runtime.pg, "pipeline", 0, 10)
    assert epoch == 1
    assert [r.offset for r in rows] == [1, 2]
    wire = rows[1].to_json()
    assert set(wire) == {"topic", "offset", "epoch", "kind", "payload", "created_at"}
    assert wire["payload"] == {"item_id": "a", "stage": "chunk"}
    assert wire["kind"] == "chunk" and wire["topic"] == "pipeline"
    json.dumps(wire)  # serialisable as is
    _, after_one = await feed.read(runtime.pg, "pipeline", 1, 10)
    assert [r.offset for r in after_one] == [2]


async def test_unknown_topic_reads_empty_at_epoch_one(runtime: Runtime) -> None:
    assert await feed.read(runtime.pg, "conversation:nobody", 0, 10) == (1, [])


async def test_topics_count_independently(runtime: Runtime) -> None:
    for topic in ("conversation:1", "conversation:2", "conversation:1"):
        await feed.append_and_publish(runtime.pg, runtime.cache, topic, "message", {})
    assert [r.offset for r in (await feed.read(runtime.pg, "conversation:1", 0, 9))[1]] == [1, 2]
    assert [r.offset for r in (await feed.read(runtime.pg, "conversation:2", 0, 9))[1]] == [1]


async def test_rolled_back_append_leaves_no_hole(runtime: Runtime) -> None:
    async with runtime.pg.acquire() as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await feed.append(conn, "pipeline", "store", {})
                raise RuntimeError("caller failed after appending")
    row = await feed.append_and_publish(runtime.pg, runtime.cache, "pipeline", "store", {})
    assert row.offset == 1


async def test_publish_sends_the_signal(runtime: Runtime) -> None:
    pubsub = runtime.cache.pubsub()
    await pubsub.subscribe(keys.push_channel("pipeline"))
    try:
        await pubsub.get_message(timeout=1)  # subscribe confirmation
        row = await feed.append_and_publish(runtime.pg, runtime.cache, "pipeline", "embed", {})
        message = None
        for _ in range(50):
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if message:
                break
        assert message is not None
        body = json.loads(message["data"])
        assert body == {"topic": "pipeline", "offset": row.offset, "kind": "embed",
                        "epoch": 1, "row": row.to_json()}  # a small row rides along
    finally:
        await pubsub.aclose()


async def test_publish_failure_is_swallowed(runtime: Runtime) -> None:
    from gateway.stores import redis as redis_clients
    dead = redis_clients.connect("redis://127.0.0.1:1/0", variable="test")
    try:
        row = await feed.append_and_publish(runtime.pg, dead, "pipeline", "store", {})
    finally:
        await dead.aclose()
    assert (await feed.read(runtime.pg, "pipeline", 0, 10))[1][0].offset == row.offset


@pytest.mark.parametrize("topic", ["", "a,b", "x" * 201, "bad topic", "ends:"])
async def test_bad_topics_are_refused(runtime: Runtime, topic: str) -> None:
    with pytest.raises(feed.FeedError):
        await feed.append_and_publish(runtime.pg, runtime.cache, topic, "k", {})


async def test_concurrent_writers_never_leave_a_hole_a_poller_skips(runtime: Runtime) -> None:
    """Writers hold their transaction open for a random while after appending; a poller
    that advances its cursor to the highest offset it saw must still see every offset."""
    writers, per_writer = 8, 15

    async def writer(n: int) -> None:
        rng = random.Random(n)
        for i in range(per_writer):
            async with runtime.pg.acquire() as conn, conn.transaction():
                await feed.append(conn, "pipeline", "store", {"w": n, "i": i})
                await asyncio.sleep(rng.random() * 0.005)  # hold the commit back a little

    rows = await follow_while(runtime, "pipeline",
                              asyncio.gather(*(writer(n) for n in range(writers))))
    seen = [row.offset for row in rows]
    assert seen == list(range(1, writers * per_writer + 1))


def test_large_rows_do_not_ride_in_the_signal() -> None:
    from gateway.push.channel import INLINE_ROW_MAX_CHARS, signal_body

    small = json.loads(signal_body("t", 1, "k", 1, '{"a":1}'))
    assert small["row"] == {"a": 1}
    large = json.loads(signal_body("t", 1, "k", 1, json.dumps({"a": "x" * INLINE_ROW_MAX_CHARS})))
    assert large == {"topic": "t", "offset": 1, "kind": "k", "epoch": 1}


async def test_retention_by_age_trims_a_prefix_only(runtime: Runtime) -> None:
    from gateway.push.retention import trim

    for _ in range(6):
        await feed.append_and_publish(runtime.pg, runtime.cache, "pipeline", "store", {})
    await feed.append_and_publish(runtime.pg, runtime.cache, "conversation:keep", "message", {})
    # Rows 1-3 and 5 are old; 4 is not (clock skew, a long transaction): the cut stops at the
    # newest old row, so 4 goes too and no hole is left behind it.
    await runtime.pg.execute(
        "UPDATE feed SET created_at = now() - interval '2 days'"
        " WHERE topic = 'pipeline' AND \"offset\" IN (1, 2, 3, 5)")
    assert await trim(runtime.pg, max_age_seconds=86400, max_rows=1000) == 5
    page = await feed.read_page(runtime.pg, "pipeline", 0, 100)
    assert page.trimmed_through == 5 and [r.offset for r in page.rows] == [6]
    assert len((await feed.read(runtime.pg, "conversation:keep", 0, 10))[1]) == 1
    assert await trim(runtime.pg, max_age_seconds=86400, max_rows=1000) == 0  # idempotent



class _RecordingConnection:
    """An asyncpg connection that notes each transaction and each DELETE's row count."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.events: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def transaction(self) -> Any:
        self.events.append("begin")
        return self._conn.transaction()

    async def execute(self, query: str, *args: Any) -> str:
        status: str = await self._conn.execute(query, *args)
        if query.lstrip().startswith("DELETE"):
            self.events.append(status)
        return status


class _RecordingPool:
    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.connections: list[_RecordingConnection] = []

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[_RecordingConnection]:
        async with self.pool.acquire() as conn:
            self.connections.append(_RecordingConnection(conn))
            yield self.connections[-1]


async def test_retention_trims_a_backlog_in_bounded_steps(runtime: Runtime, monkeypatch) -> None:
    """Each step is its own short transaction holding the topic's counter row for one
    bounded DELETE, so writers of the topic get in between steps."""
    from gateway.push import retention

    async with runtime.pg.acquire() as conn, conn.transaction():
        for _ in range(25):
            await feed.append(conn, "pipeline", "store", {})
    monkeypatch.setattr(retention, "TRIM_BATCH", 7)
    pool = _RecordingPool(runtime.pg)
    assert await retention.trim(pool, max_age_seconds=86400, max_rows=5) == 20
    (recorded,) = pool.connections
    assert recorded.events == ["begin", "DELETE 7", "begin", "DELETE 7", "begin", "DELETE 6"]
    page = await feed.read_page(runtime.pg, "pipeline", 0, 100)
    assert page.trimmed_through == 20 and [r.offset for r in page.rows] == list(range(21, 26))


async def test_signals_built_by_postgresql_carry_what_signal_body_writes(
        runtime: Runtime) -> None:
    """The numbering statement writes each signal's JSON itself (``feed.number_pending``),
    a twin of ``channel.signal_body`` over the row's wire form: the same values (created_at
    as ``isoformat`` writes it), text that needs escapes, a row too large to ride along."""
    from gateway.push.channel import INLINE_ROW_MAX_CHARS, signal_body

    payloads = [{"text": 'café "quoted" \\ \n\u2603', "n": [1, 2.5, None, True]},
                {"big": "x" * INLINE_ROW_MAX_CHARS}, {}]
    async with runtime.pg.acquire() as conn, conn.transaction():
        await feed.append_pending(conn, "pipeline", [("store", p) for p in payloads])
    numbered = await feed.number_pending(runtime.pg, "pipeline", 10)
    rows, signals = numbered.rows(), numbered.signals()
    assert [row.payload for row in rows] == payloads
    assert [topic for topic, _ in signals] == ["pipeline"] * 3
    for row, (_, body) in zip(rows, signals, strict=True):
        wire = json.dumps(row.to_json(), separators=(",", ":"))
        assert json.loads(body) == json.loads(signal_body(row.topic, row.offset, row.kind,
                                                          row.epoch, wire))
    assert "row" in json.loads(signals[0][1]) and "row" not in json.loads(signals[1][1])
