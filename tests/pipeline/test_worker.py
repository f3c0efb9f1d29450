"""Workers end to end on real servers: default handlers write PostgreSQL, journal + feed per
completion, failures retry then dead-letter, graceful stop loses nothing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import asyncpg
import pytest
from redis.exceptions import ResponseError

from gateway import keys
from gateway.app.worker import run_workers
from gateway.knowledge.stages import DEFAULTS
from gateway.pipeline import queue
from gateway.pipeline.handlers import StageContext
from gateway.pipeline.stages import STAGES, dead_key, meta_key, seen_key
from gateway.pipeline.status import job_status, queue_depths
from gateway.pipeline.worker import StageWorker, WorkerConfig
from tests.helpers import registry_violations, wait_until
from tests.pipeline.helpers import FAST, store_reclaimed

TEXT = ("Read https://example.org/guide. Thanks @alice and @bob!\n\n"
        "Tagged #python #asyncio. Redis queues and PostgreSQL journals.")


async def _journal_count(runtime, stage: str | None = None) -> int:
    if stage:
        return await runtime.pg.fetchval(
            "SELECT count(*) FROM pipeline_journal WHERE stage = $1", stage)
    return await runtime.pg.fetchval("SELECT count(*) FROM pipeline_journal")


@contextlib.asynccontextmanager
async def _workers(runtime, **kwargs):
    """Workers running for the block; stopped and waited for (10 s at most) when it ends."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_workers(runtime, stop, config=kwargs.pop("config", FAST),
                                           concurrency=kwargs.pop("concurrency", 2),
                                           **kwargs))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_items_flow_through_all_stages_with_default_handlers(runtime):
    for i in range(5):
        assert await queue.enqueue(runtime.durable, f"doc{i}",
                                   {"text": f"{TEXT} item {i}", "title": f"T{i}"})
    async with _workers(runtime):
        await wait_until(lambda: _all_journaled(runtime, 20), timeout=20,
                         message="20 journal rows")
    assert await runtime.pg.fetchval("SELECT count(*) FROM pipeline_documents") == 5
    chunks = await runtime.pg.fetch("SELECT * FROM pipeline_chunks WHERE item_id = 'doc0'")
    assert chunks and all(len(c["embedding"]) == 256 for c in chunks)
    edges = {(r["kind"], r["target"]) for r in await runtime.pg.fetch(
        "SELECT kind, target FROM pipeline_edges WHERE item_id = 'doc0'")}
    assert edges == {("link", "https://example.org/guide"), ("mention", "alice"),
                     ("mention", "bob"), ("tag", "python"), ("tag", "asyncio")}
    feed_rows = await runtime.pg.fetch(
        "SELECT \"offset\", kind, payload FROM feed WHERE topic = 'pipeline'"
        " ORDER BY \"offset\"")
    assert [r["offset"] for r in feed_rows] == list(range(1, 21))  # batches leave no hole
    assert sorted((r["payload"]["item_id"], r["kind"]) for r in feed_rows) == sorted(
        (f"doc{i}", s) for i in range(5) for s in STAGES)
    assert await job_status(runtime, "doc3") == {
        "item_id": "doc3", "state": "done", "stages": dict.fromkeys(STAGES, "done")}
    # Nothing of a finished item is left in Redis but its dedup entry.
    assert await runtime.durable.hlen(meta_key()) == 0
    assert await registry_violations(runtime.durable, "durable") == []


async def _all_journaled(runtime, n: int) -> bool:
    return await _journal_count(runtime) >= n


async def test_a_stage_fed_by_this_process_is_woken_by_its_completions(runtime):
    """The loops of chunk, embed and graph wait up to ``idle_max`` (60 s here) after a FETCH
    that found nothing (their first: their stages are empty until store completes the item),
    and the completions of the stage before wake them: the item passes every stage long
    before one such wait could have ended."""
    config = dataclasses.replace(FAST, idle_max=60.0)
    assert await queue.enqueue(runtime.durable, "woken", {"text": TEXT})
    async with _workers(runtime, config=config):
        await wait_until(lambda: _all_journaled(runtime, 4), timeout=30,
                         message="the item through all four stages")
    assert await job_status(runtime, "woken") == {
        "item_id": "woken", "state": "done", "stages": dict.fromkeys(STAGES, "done")}


async def test_failing_handler_retries_then_dead_letters(runtime):
    calls: list[str] = []

    async def flaky(ctx: StageContext) -> None:
        calls.append(ctx.item_id)
        await ctx.conn.execute("INSERT INTO pipeline_edges VALUES ($1, 'tag', 'half-done')",
                               ctx.item_id)
        raise RuntimeError("provider down")

    await queue.enqueue(runtime.durable, "a", {"text": "x"})
    async with _workers(runtime, handlers={**DEFAULTS, "chunk": flaky},
                        config=WorkerConfig(**{**FAST.__dict__, "max_failures": 3})):
        await wait_until(lambda: runtime.durable.llen(dead_key("chunk")), timeout=15,
                         message="dead letter")
    assert calls == ["a", "a", "a"]
    # Every failed attempt rolled back its partial writes and its journal row.
    assert await runtime.pg.fetchval("SELECT count(*) FROM pipeline_edges") == 0
    assert await _journal_count(runtime) == 1  # store only
    status = await job_status(runtime, "a")
    assert status["state"] == "dead" and status["stages"]["chunk"] == "dead"


async def test_bad_document_is_dead_lettered_at_once(runtime):
    await queue.enqueue(runtime.durable, "bad", {"title": "no text"})
    async with _workers(runtime):
        await wait_until(lambda: runtime.durable.llen(dead_key("store")), timeout=10,
                         message="dead letter")
    assert await _journal_count(runtime) == 0


async def test_graceful_stop_releases_in_flight_items(runtime):
    started = asyncio.Event()

    async def slow(ctx: StageContext) -> None:
        started.set()
        await asyncio.sleep(30)

    await queue.enqueue(runtime.durable, "a", {"text": "x"})
    config = WorkerConfig(**{**FAST.__dict__, "shutdown_grace": 0.2})
    async with _workers(runtime, handlers={**DEFAULTS, "store": slow}, config=config):
        await asyncio.wait_for(started.wait(), 10)
    depths = await queue_depths(runtime.durable)
    assert depths["stages"]["store"] == {"ready": 1, "inflight": 0, "delayed": 0, "dead": 0}
    lease = await queue.fetch(runtime.durable, "store", "w", 60_000)
    assert lease is not None and lease.failures == 0 and lease.document == {"text": "x"}
    assert await _journal_count(runtime) == 0


async def test_one_bad_item_in_a_batch_holds_back_no_other(runtime):
    async def picky(ctx: StageContext) -> None:
        await DEFAULTS["store"](ctx)
        await ctx.conn.execute("INSERT INTO pipeline_edges VALUES ($1, 'tag', 'seen')",
                               ctx.item_id)
        if ctx.item_id == "bad":
            raise RuntimeError("nope")

    for item_id in ("a", "b", "bad", "c"):
        await queue.enqueue(runtime.durable, item_id, {"text": item_id})
    config = WorkerConfig(**{**FAST.__dict__, "batch": 4, "max_failures": 1})
    async with _workers(runtime, concurrency=1, config=config,
                        handlers={**DEFAULTS, "store": picky}):
        await wait_until(lambda: runtime.durable.llen(dead_key("store")), timeout=10,
                         message="the bad item dead-lettered")
        await wait_until(lambda: _all_journaled(runtime, 12), timeout=10,
                         message="the others through chunk/embed/graph")
    edges = await runtime.pg.fetch("SELECT item_id FROM pipeline_edges WHERE target = 'seen'")
    assert sorted(r["item_id"] for r in edges) == ["a", "b", "c"]  # bad's write rolled back
    journal = await runtime.pg.fetch("SELECT DISTINCT item_id FROM pipeline_journal")
    assert sorted(r["item_id"] for r in journal) == ["a", "b", "c"]



class _CountingPool:
    """A pool whose server is gone, counting how often the worker tried it."""

    def __init__(self, pool) -> None:
        self.pool = pool
        self.attempts = 0

    def acquire(self):
        self.attempts += 1
        return self.pool.acquire()


async def test_postgres_outage_releases_items_without_counting_failures(runtime):
    from gateway.stores import embedded
    from gateway.stores.runtime import Runtime

    dead_pg = await asyncpg.create_pool(
        f"postgresql://nobody@127.0.0.1:{embedded.free_port()}/none", min_size=0)
    counting = _CountingPool(dead_pg)
    broken = Runtime(runtime.settings, runtime.durable, runtime.cache, counting)
    await queue.enqueue(runtime.durable, "a", {"text": "x"})
    try:
        async with _workers(broken, stages=("store",), concurrency=1):
            await wait_until(lambda: counting.attempts >= 3, timeout=10,
                             message="three attempts against the dead server")
    finally:
        await dead_pg.close()
    lease = await queue.fetch(runtime.durable, "store", "w", 60_000)
    assert lease is not None and lease.failures == 0 and lease.reclaims == 0
    assert await runtime.durable.llen(dead_key("store")) == 0


async def test_a_failed_complete_still_runs_the_batchs_fails_and_after_commit_work(
        runtime, monkeypatch):
    """COMPLETE fails after the commit (here: once, an error reply): the batch's failed item
    is still FAILed and the committed items' after-commit callbacks still run."""
    ran: list[str] = []

    async def handler(ctx: StageContext) -> None:
        if ctx.item_id == "bad":
            raise RuntimeError("broken document")
        ctx.after_commit.append(lambda: _note(ran, ctx.item_id))

    real_complete = queue.complete_many

    async def complete_failing_once(durable, leases):
        monkeypatch.setattr(queue, "complete_many", real_complete)
        raise ResponseError("MISCONF simulated")

    for item_id in ("good", "bad"):
        await queue.enqueue(runtime.durable, item_id, {"text": item_id})
    leases = await queue.fetch_many(runtime.durable, "store", "w", 60_000, 2)
    assert len(leases) == 2
    monkeypatch.setattr(queue, "complete_many", complete_failing_once)
    worker = StageWorker(runtime, "store", handler, FAST)
    with pytest.raises(ResponseError):
        await worker.process(leases)
    assert ran == ["good"]
    assert (await job_status(runtime, "bad"))["stages"]["store"] == "retrying"
    # "good" is journaled but unacknowledged: RECLAIM returns it and it is only acknowledged.
    assert await _journal_count(runtime, "store") == 1


async def test_a_batchs_feed_rows_are_one_pending_entry_per_topic(runtime, monkeypatch):
    """A batch's completions wait for their offsets as one ``feed_pending`` entry per topic
    (the items' payloads in lease order), not one row per item and topic; the pass makes
    one feed row per item on each topic, in that order, gapless."""
    from gateway.pipeline.worker import feed_topics
    from gateway.push.sequencer import Sequencer

    seen: list[tuple[str, int]] = []
    real_number = Sequencer.number

    async def number(self, topic):  # what the commit left, before the pass takes it
        seen.extend(await runtime.pg.fetch(
            "SELECT topic, jsonb_array_length(payloads) FROM feed_pending ORDER BY topic"))
        return await real_number(self, topic)

    monkeypatch.setattr(Sequencer, "number", number)
    for i in range(3):
        await queue.enqueue(runtime.durable, f"doc{i}", {"text": f"text {i}"})
    leases = await queue.fetch_many(runtime.durable, "store", "w", 60_000, 3)
    assert len(leases) == 3
    await StageWorker(runtime, "store", _noop, FAST).process(leases)
    owner = feed_topics("doc0")[1]
    assert {feed_topics(lease.item_id)[1] for lease in leases} == {owner}
    assert [tuple(r) for r in seen] == [("pipeline", 3), (owner, 3)]
    for topic in ("pipeline", owner):
        rows = await runtime.pg.fetch(
            "SELECT \"offset\", payload FROM feed WHERE topic = $1 ORDER BY \"offset\"", topic)
        assert [(r["offset"], r["payload"]) for r in rows] == [
            (n + 1, {"item_id": lease.item_id, "stage": "store"})
            for n, lease in enumerate(leases)]


async def _noop(ctx: StageContext) -> None:
    return None


async def _note(ran: list[str], item_id: str) -> None:
    ran.append(item_id)


async def test_a_job_id_reused_after_the_dedup_window_runs_every_stage_again(
        runtime, make_client):
    """The window is ``GATEWAY_DEDUP_TTL`` for the claim and for ADD alike; once it has
    passed, the same job_id is a new job: its new document is stored and every stage runs
    again (the earlier run's journal rows no longer count), not skipped as done."""
    client = await make_client()
    job = {"job_id": "weekly-report", "document": {"text": "first edition #one"}}
    assert (await client.post("/v1/jobs", json=job)).status == 202
    async with _workers(runtime):
        await wait_until(lambda: _journal_count(runtime, "graph"), timeout=20)
    # The window passes: the claim expires, the first-seen entry is older than the window,
    # and the first run finished long ago.
    window_ms = runtime.settings.dedup_ttl * 1000
    now_ms = int((await runtime.durable.time())[0]) * 1000
    await runtime.durable.delete(keys.dedup_job("weekly-report"))
    await runtime.durable.hset(seen_key("weekly-report"), "weekly-report",
                               now_ms - window_ms - 5000)
    # Rows as written before the journal kept lease times: judged by completion time.
    await runtime.pg.execute(
        "UPDATE pipeline_journal SET completed_at = now() - interval '2 days', leased_ms = NULL")
    job["document"] = {"text": "second edition #two"}
    again = await client.post("/v1/jobs", json=job)
    assert again.status == 202 and (await again.json())["status"] == "accepted"
    async with _workers(runtime):
        await wait_until(lambda: _fresh_graph_row(runtime), timeout=20)
    assert await runtime.pg.fetchval(
        "SELECT body FROM pipeline_documents WHERE item_id = 'weekly-report'") == \
        "second edition #two"
    edges = await runtime.pg.fetch("SELECT target FROM pipeline_edges ORDER BY target")
    assert [e["target"] for e in edges] == ["two"]
    assert await _journal_count(runtime) == 4


async def _fresh_graph_row(runtime) -> bool:
    return bool(await runtime.pg.fetchval(
        "SELECT count(*) FROM pipeline_journal WHERE stage = 'graph'"
        " AND completed_at > now() - interval '1 hour'"))


async def test_a_reclaimed_item_keeps_its_priority_in_the_journal(runtime):
    """Reclaimed items score with base 10, which is also critical's base: the journal and
    the stored document must still name the priority it was submitted with."""
    await queue.enqueue(runtime.durable, "slow", {"text": "held by a dead worker"},
                        priority="normal", doc_type="code")
    assert await queue.fetch(runtime.durable, "store", "dead-worker", 1) is not None
    await wait_until(lambda: store_reclaimed(runtime.durable),
                     message="the expired lease reclaimed")
    async with _workers(runtime):
        await wait_until(lambda: _journal_count(runtime, "graph"), timeout=20)
    rows = await runtime.pg.fetch("SELECT DISTINCT priority, doc_type FROM pipeline_journal")
    assert [tuple(r) for r in rows] == [("normal", "code")]
    assert await runtime.pg.fetchval(
        "SELECT priority FROM pipeline_documents WHERE item_id = 'slow'") == "normal"

