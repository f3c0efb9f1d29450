"""Rows appended without an offset (``feed.append_pending``) and numbered after the commit
(``Sequencer``): gapless offsets in numbering order, no lock held across a writer's
transaction, nothing lost when a writer dies between its commit and the numbering."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import textwrap

import asyncpg
import pytest

from gateway import keys
from gateway.push import feed, retention
from gateway.push.sequencer import Sequencer
from gateway.stores.runtime import Runtime
from tests.fakes.waiting import wait_until
from tests.push.polling import follow_while


async def _commit_pending(runtime: Runtime, topic: str, rows: list[tuple[str, dict]]) -> None:
    async with runtime.pg.acquire() as conn, conn.transaction():
        await feed.append_pending(conn, topic, rows)


async def test_pending_rows_are_invisible_until_numbered_then_consecutive_in_order(
        runtime: Runtime) -> None:
    await feed.append_and_publish(runtime.pg, runtime.cache, "pipeline", "store", {"n": 0})
    await _commit_pending(runtime, "pipeline", [("chunk", {"n": 1}), ("embed", {"n": 2})])
    assert (await feed.read_page(runtime.pg, "pipeline", 0, 10)).last_offset == 1
    assert [r.offset for r in (await feed.read(runtime.pg, "pipeline", 0, 10))[1]] == [1]
    numbered = await Sequencer(runtime.pg, runtime.cache).sequence("pipeline")
    assert [(r.offset, r.kind, r.payload) for r in numbered] == [
        (2, "chunk", {"n": 1}), (3, "embed", {"n": 2})]
    page = await feed.read_page(runtime.pg, "pipeline", 0, 10)
    assert page.last_offset == 3 and [r.wire for r in page.rows[1:]] == [r.wire for r in numbered]
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed_pending") == 0
    # A direct append after them goes on from there.
    assert (await feed.append_and_publish(runtime.pg, runtime.cache, "pipeline", "x", {})
            ).offset == 4


async def test_an_entry_of_several_rows_is_numbered_in_place_among_single_rows(
        runtime: Runtime) -> None:
    """An entry with ``payloads`` (a pipeline batch's rows of one topic) stands for one row
    per payload, in the array's order, at its place among the other entries; an empty array
    is refused (it would count no row but make one)."""
    await _commit_pending(runtime, "pipeline", [("a", {"n": 0})])
    await runtime.pg.execute("INSERT INTO feed_pending (topic, kind, payloads)"
                             " VALUES ('pipeline', 'b', $1)", [{"n": 1}, {"n": 2}])
    await _commit_pending(runtime, "pipeline", [("c", {"n": 3})])
    numbered = await Sequencer(runtime.pg, runtime.cache).sequence("pipeline")
    assert [(r.offset, r.kind, r.payload) for r in numbered] == [
        (1, "a", {"n": 0}), (2, "b", {"n": 1}), (3, "b", {"n": 2}), (4, "c", {"n": 3})]
    assert (await feed.read_page(runtime.pg, "pipeline", 0, 10)).last_offset == 4
    with pytest.raises(asyncpg.CheckViolationError):
        await runtime.pg.execute("INSERT INTO feed_pending (topic, kind, payloads)"
                                 " VALUES ('pipeline', 'b', '[]')")


async def test_numbering_signals_each_row_in_order(runtime: Runtime) -> None:
    pubsub = runtime.cache.pubsub()
    await pubsub.subscribe(keys.push_channel("pipeline"))
    try:
        await pubsub.get_message(timeout=1)  # subscribe confirmation
        await _commit_pending(runtime, "pipeline", [("store", {"i": i}) for i in range(3)])
        numbered = await Sequencer(runtime.pg, runtime.cache).sequence("pipeline")
        got: list[dict] = []

        async def three() -> bool:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if message:
                got.append(json.loads(message["data"]))
            return len(got) == 3

        await wait_until(three, timeout=5, message="three signals")
        assert [(s["offset"], s["row"]) for s in got] == [(r.offset, r.to_json())
                                                          for r in numbered]
    finally:
        await pubsub.aclose()


async def test_an_open_writer_transaction_holds_back_no_other_writer(runtime: Runtime) -> None:
    """The property the pending path exists for: writer A has appended and not committed;
    writer B appends, commits and is numbered meanwhile (with the counter-row append, B
    would wait for A). Offsets follow numbering, so A, committing later, comes after B."""
    sequencer = Sequencer(runtime.pg, runtime.cache)
    async with runtime.pg.acquire() as slow, slow.transaction():
        await feed.append_pending(slow, "pipeline", [("slow", {})])
        async with asyncio.timeout(5):  # a lock held by A would stop B here
            await _commit_pending(runtime, "pipeline", [("fast", {})])
            assert [r.kind for r in await sequencer.sequence("pipeline")] == ["fast"]
        assert [r.offset for r in (await feed.read(runtime.pg, "pipeline", 0, 9))[1]] == [1]
    assert [(r.offset, r.kind) for r in await sequencer.sequence("pipeline")] == [(2, "slow")]


async def test_a_rolled_back_pending_append_leaves_no_hole(runtime: Runtime) -> None:
    async with runtime.pg.acquire() as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await feed.append_pending(conn, "pipeline", [("store", {})] * 3)
                raise RuntimeError("caller failed after appending")
    await _commit_pending(runtime, "pipeline", [("store", {})])
    assert [r.offset for r in await Sequencer(runtime.pg, runtime.cache).sequence("pipeline")
            ] == [1]


async def test_bad_pending_rows_write_nothing(runtime: Runtime) -> None:
    async with runtime.pg.acquire() as conn, conn.transaction():
        assert await feed.append_pending(conn, "pipeline", []) == 0
        with pytest.raises(feed.FeedError):
            await feed.append_pending(conn, "pipeline", [("ok", {}), ("bad\nkind", {})])
        with pytest.raises(feed.FeedError):
            await feed.append_pending(conn, "bad topic", [("ok", {})])
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed_pending") == 0


async def test_concurrent_writers_of_several_processes_get_gapless_ordered_offsets(
        runtime: Runtime) -> None:
    """Twelve writers spread over three sequencers (three processes' worth) commit blocks of
    1-6 pending rows, holding each commit back a random while, and number after each commit;
    two more append with the counter row on the same topic. A poller that advances its
    cursor to the highest offset it saw sees every offset once, 1..N in order, each
    transaction's rows in the order given, and after the last call nothing is pending."""
    sequencers = [Sequencer(runtime.pg, runtime.cache) for _ in range(3)]
    writers, direct_writers, rounds = 12, 2, 8
    written = 0

    async def writer(n: int) -> None:
        nonlocal written
        rng = random.Random(n)
        for i in range(rounds):
            size = rng.randint(1, 6)
            async with runtime.pg.acquire() as conn, conn.transaction():
                rows = [("w", {"w": n, "i": i, "k": k}) for k in range(size)]
                if n < direct_writers:
                    await feed.append_many(conn, "pipeline", rows)
                else:
                    await feed.append_pending(conn, "pipeline", rows)
                await asyncio.sleep(rng.random() * 0.004)
            written += size
            if n >= direct_writers:
                await sequencers[n % 3].sequence("pipeline")

    seen = await follow_while(runtime, "pipeline",
                              asyncio.gather(*(writer(n) for n in range(writers))))
    assert [r.offset for r in seen] == list(range(1, written + 1))
    by_txn: dict[tuple[int, int], list[int]] = {}
    for row in seen:
        by_txn.setdefault((row.payload["w"], row.payload["i"]), []).append(row.payload["k"])
    assert len(by_txn) == writers * rounds
    assert all(ks == list(range(len(ks))) for ks in by_txn.values())
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed_pending") == 0


async def test_one_pass_covers_the_writers_that_committed_while_another_ran(
        runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Group commit of offsets: many writers of one process asking at once cost a couple of
    numbering passes, not one each."""
    sequencer = Sequencer(runtime.pg, runtime.cache)
    passes = 0
    real = feed.number_pending

    async def counting(conn, topic, limit):  # type: ignore[no-untyped-def]
        nonlocal passes
        passes += 1
        return await real(conn, topic, limit)

    async def one(i: int) -> None:
        await _commit_pending(runtime, "pipeline", [("w", {"i": i})])
        await sequencer.sequence("pipeline")

    monkeypatch.setattr(feed, "number_pending", counting)
    await asyncio.gather(*(one(i) for i in range(20)))
    assert (await feed.read_page(runtime.pg, "pipeline", 0, 100)).last_offset == 20
    assert passes < 20


_DIES_AFTER_COMMIT = textwrap.dedent("""
    import asyncio, os, signal, sys
    import asyncpg
    from gateway.push import feed

    async def main():
        conn = await asyncpg.connect(sys.argv[1])
        async with conn.transaction():
            await feed.append_pending(conn, "pipeline", [("orphan", {"k": k}) for k in range(3)])
        os.kill(os.getpid(), signal.SIGKILL)  # committed, never numbered

    asyncio.run(main())
""")


def _writer_dies_after_commit(database_url: str) -> None:
    done = subprocess.run([sys.executable, "-c", _DIES_AFTER_COMMIT, database_url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr


async def test_a_writer_killed_between_commit_and_numbering_loses_nothing(
        runtime: Runtime) -> None:
    """A real process commits three pending rows and is SIGKILLed before numbering them: the
    next writer's pass numbers them first (they committed first), then its own."""
    await asyncio.to_thread(_writer_dies_after_commit, runtime.settings.database_url)
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed_pending") == 3
    await _commit_pending(runtime, "pipeline", [("next", {})])
    await Sequencer(runtime.pg, runtime.cache).sequence("pipeline")
    rows = (await feed.read(runtime.pg, "pipeline", 0, 10))[1]
    assert [(r.offset, r.kind) for r in rows] == [
        (1, "orphan"), (2, "orphan"), (3, "orphan"), (4, "next")]
    assert [r.payload["k"] for r in rows[:3]] == [0, 1, 2]


async def test_the_sweeper_numbers_what_a_dead_writer_left_when_nobody_writes(
        runtime: Runtime) -> None:
    await asyncio.to_thread(_writer_dies_after_commit, runtime.settings.database_url)
    sequencer = Sequencer(runtime.pg, runtime.cache)
    assert await sequencer.sweep(older_than_seconds=3600) == 0  # too young to be an orphan
    stop = asyncio.Event()
    sweeper = asyncio.create_task(sequencer.run_sweeper(stop, interval=0.05,
                                                        older_than_seconds=0))
    try:
        async def numbered() -> list[feed.FeedRow]:
            return (await feed.read(runtime.pg, "pipeline", 0, 10))[1]

        await wait_until(numbered, timeout=10, message="the orphaned rows numbered")
    finally:
        stop.set()
        await sweeper
    assert [r.offset for r in (await feed.read(runtime.pg, "pipeline", 0, 10))[1]] == [1, 2, 3]
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed_pending") == 0


async def test_reset_drops_rows_still_pending(runtime: Runtime) -> None:
    await feed.append_and_publish(runtime.pg, runtime.cache, "pipeline", "store", {})
    await _commit_pending(runtime, "pipeline", [("store", {})])
    assert await retention.reset(runtime.pg, runtime.cache, "pipeline") == 2
    assert await Sequencer(runtime.pg, runtime.cache).sequence("pipeline") == []
    page = await feed.read_page(runtime.pg, "pipeline", 0, 10)
    assert (page.epoch, page.last_offset, page.rows) == (2, 0, [])


async def test_a_worker_whose_numbering_failed_after_commit_still_gets_its_rows_out(
        runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every numbering the worker loops ask for fails (PostgreSQL gone between their commit
    and their pass): the items are acknowledged all the same (the commit stands), and the
    worker process's sweeper numbers the rows, gapless, once they are old enough."""
    from gateway.app.worker import run_workers
    from gateway.pipeline import queue
    from gateway.pipeline.stages import STAGES, stats_key
    from gateway.push import sequencer as sequencer_module
    from tests.pipeline.helpers import FAST

    real = feed.number_pending
    broken = True

    async def failing(conn, topic, limit):  # type: ignore[no-untyped-def]
        if broken:
            raise OSError("connection lost after the commit")
        return await real(conn, topic, limit)

    monkeypatch.setattr(feed, "number_pending", failing)
    monkeypatch.setattr(sequencer_module, "SWEEP_SECONDS", 0.1)
    monkeypatch.setattr(sequencer_module, "SWEEP_AGE_SECONDS", 3600.0)  # not yet
    for i in range(3):
        await queue.enqueue(runtime.durable, f"doc{i}", {"text": f"text {i}"})
    stop = asyncio.Event()
    workers = asyncio.create_task(run_workers(runtime, stop, config=FAST, concurrency=2))
    try:
        async def graphed() -> bool:
            return int(await runtime.durable.hget(stats_key("graph"), "completed") or 0) == 3

        await wait_until(graphed, timeout=20, message="3 items through every stage")
        # Each completion on the operators' topic and on its owner's (the admin's: ops).
        assert dict(await runtime.pg.fetch(
            "SELECT topic, sum(coalesce(jsonb_array_length(payloads), 1)) FROM feed_pending"
            " GROUP BY topic")) == {"pipeline": 12, "pipeline:ops": 12}
        assert (await feed.read(runtime.pg, "pipeline", 0, 100))[1] == []
        broken = False
        monkeypatch.setattr(sequencer_module, "SWEEP_AGE_SECONDS", 0.0)

        async def numbered() -> list[feed.FeedRow]:
            return (await feed.read(runtime.pg, "pipeline", 0, 100))[1]

        await wait_until(lambda: _all(numbered, 12), timeout=10, message="12 rows numbered")
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await workers
    for topic in ("pipeline", "pipeline:ops"):
        rows = (await feed.read(runtime.pg, topic, 0, 100))[1]
        assert [r.offset for r in rows] == list(range(1, 13))
        assert sorted((r.payload["item_id"], r.kind) for r in rows) == sorted(
            (f"doc{i}", stage) for i in range(3) for stage in STAGES)


async def _all(read, count: int) -> bool:  # type: ignore[no-untyped-def]
    return len(await read()) == count
