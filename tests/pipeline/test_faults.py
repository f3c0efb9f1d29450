"""Fault tests on real servers: kill -9 of a worker mid-item, durable Redis restarted (AOF)
mid-run, durable Redis wiped then `gateway recover`, concurrent workers never share an item."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from prometheus_client import REGISTRY

from gateway.app.worker import run_workers
from gateway.pipeline import queue
from gateway.pipeline.recover import recover
from gateway.pipeline.stages import STAGES, deadline_key, stats_key
from gateway.pipeline.worker import StageWorker, WorkerConfig
from gateway.stores import redis as redis_clients
from gateway.stores.runtime import open_runtime
from tests.helpers import wait_until

FAST = WorkerConfig(lease=1.5, heartbeat=0.3, reclaim_interval=0.2, backoff=0.05,
                    backoff_cap=0.2, idle_max=0.05, shutdown_grace=5, batch=4)


@contextlib.asynccontextmanager
async def _workers(runtime, **kwargs) -> AsyncIterator[None]:
    """Workers for all (or the given) stages while the block runs, then a graceful stop."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_workers(runtime, stop, **{"config": FAST, **kwargs}))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def _journal(runtime) -> Counter[tuple[str, str]]:
    rows = await runtime.pg.fetch("SELECT item_id, stage FROM pipeline_journal")
    return Counter((r["item_id"], r["stage"]) for r in rows)


async def _feed(runtime) -> Counter[tuple[str, str]]:
    rows = await runtime.pg.fetch("SELECT kind, payload FROM feed WHERE topic = 'pipeline'")
    return Counter((r["payload"]["item_id"], r["kind"]) for r in rows)


async def _finished(runtime, n: int) -> bool:
    return await runtime.pg.fetchval(
        "SELECT count(*) FROM pipeline_journal WHERE stage = 'graph'") >= n


async def _exactly_once(runtime, ids: list[str]) -> None:
    expected = Counter((i, s) for i in ids for s in STAGES)
    assert await _journal(runtime) == expected
    assert await _feed(runtime) == expected


@pytest.mark.slow
async def test_kill_9_worker_mid_item_is_reclaimed_and_completed_once(runtime, servers,
                                                                      tmp_path):
    config = tmp_path / "gateway.toml"
    config.write_text('[pipeline.handlers]\nstore = "tests.pipeline.slow_handlers:'
                      'store_then_hang"\n')
    env = {**os.environ, "GATEWAY_DURABLE_URL": servers.durable_url,
           "GATEWAY_CACHE_URL": servers.cache_url, "GATEWAY_DATABASE_URL": servers.database_url,
           "GATEWAY_LEASE_SECONDS": "2", "GATEWAY_HEARTBEAT_SECONDS": "1",
           "GATEWAY_CONFIG": str(config)}
    await queue.enqueue(runtime.durable, "victim", {"text": "hello @ann #x"})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "worker", "--stages", "store", "--concurrency",
        "1", env=env, cwd=os.getcwd(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The subprocess holds the lease and its handler has written (uncommitted) rows.
        await wait_until(lambda: runtime.durable.zcard(deadline_key("store")), timeout=20,
                         message="the subprocess to lease the item")
        await wait_until(lambda: _open_insert(runtime), timeout=20,
                         message="the handler's uncommitted write")
    finally:
        proc.kill()  # SIGKILL: no cleanup, no release
        await asyncio.wait_for(proc.wait(), 10)
    # Its lease expires (no more heartbeats); RECLAIM runs in this process's workers, which
    # then complete the item with the default handlers.
    async with _workers(runtime, concurrency=1):
        await wait_until(lambda: _finished(runtime, 1), timeout=30, message="completion")
    await _exactly_once(runtime, ["victim"])
    assert int(await runtime.durable.hget(stats_key("store"), "reclaimed")) == 1
    assert int(await runtime.durable.hget(stats_key("chunk"), "enqueued")) == 1
    assert await runtime.pg.fetchval("SELECT count(*) FROM pipeline_documents") == 1


async def _open_insert(runtime) -> bool:
    """True once another session holds an open transaction that wrote the journal row."""
    return bool(await runtime.pg.fetchval(
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
        " WHERE c.relname = 'pipeline_journal' AND l.mode = 'RowExclusiveLock'"
        " AND l.pid <> pg_backend_pid()"))


async def test_durable_restart_mid_run_loses_nothing(runtime, servers, redis_factory):
    server = redis_factory("durable")
    rt = await open_runtime(replace(runtime.settings, durable_url=server.url))
    ids = [f"r{i}" for i in range(300)]
    try:
        for item_id in ids:
            await queue.enqueue(rt.durable, item_id, {"text": f"item {item_id} #t"})
        async with _workers(rt, concurrency=4):
            await wait_until(lambda: _finished(runtime, 1), timeout=30, message="progress")
            await asyncio.to_thread(server.restart)
            done_at_restart = await runtime.pg.fetchval(
                "SELECT count(*) FROM pipeline_journal WHERE stage = 'graph'")
            await wait_until(lambda: _finished(runtime, len(ids)), timeout=60,
                             message="every item through graph")
        await _exactly_once(runtime, ids)
        assert done_at_restart < len(ids)  # the restart really happened mid-run
    finally:
        await rt.close()


async def test_wiped_durable_is_rebuilt_by_recover(runtime):
    ids = [f"w{i}" for i in range(20)]
    for item_id in ids:
        await queue.enqueue(runtime.durable, item_id, {"text": f"text of {item_id}"})
    # Only store and chunk run, then Redis is wiped with items at chunk and embed. (Items not
    # yet stored had their payload only in Redis: recover cannot rebuild those.)
    async with _workers(runtime, stages=("store", "chunk"), concurrency=2):
        await wait_until(lambda: _stage_count(runtime, "store", len(ids)), timeout=20,
                         message="every item stored")
    await runtime.durable.flushall()
    report = await recover(runtime)
    assert report.requeued == len(ids) and report.present == 0
    again = await recover(runtime)  # idempotent: everything is present now
    assert again.requeued == 0 and again.present == len(ids)
    async with _workers(runtime, concurrency=2):
        await wait_until(lambda: _finished(runtime, len(ids)), timeout=30,
                         message="all items finished")
    await _exactly_once(runtime, ids)


async def _stage_count(runtime, stage: str, n: int) -> bool:
    return await runtime.pg.fetchval(
        "SELECT count(*) FROM pipeline_journal WHERE stage = $1", stage) >= n


async def test_concurrent_workers_never_hold_the_same_item(runtime):
    """Three workers (separate identities, 8 loops each) on one stage; every lease taken is
    recorded, and no item is ever held by two at once nor handled twice."""
    holders: dict[str, str] = {}
    handled: Counter[str] = Counter()
    overlaps: list[str] = []

    async def tracking(ctx) -> None:
        if ctx.item_id in holders:
            overlaps.append(ctx.item_id)
        holders[ctx.item_id] = ctx.stage
        handled[ctx.item_id] += 1
        await asyncio.sleep(0)
        del holders[ctx.item_id]

    ids = [f"c{i}" for i in range(150)]
    for item_id in ids:
        await queue.enqueue(runtime.durable, item_id, {"text": "x"})
    stop = asyncio.Event()
    workers = [StageWorker(runtime, "store", tracking, FAST, name=f"w{n}") for n in range(3)]
    tasks = [asyncio.create_task(w.run(stop, 8)) for w in workers]
    try:
        await wait_until(lambda: _stage_count(runtime, "store", len(ids)), timeout=30,
                         message="all items handled")
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert overlaps == []
    assert handled == Counter(ids)
    workers_used = await runtime.pg.fetchval(
        "SELECT count(DISTINCT worker) FROM pipeline_journal")
    assert workers_used == 3


async def test_script_flush_while_workers_run(runtime):
    ids = [f"f{i}" for i in range(200)]
    for item_id in ids:
        await queue.enqueue(runtime.durable, item_id, {"text": f"text {item_id}"})
    async with _workers(runtime, concurrency=2):
        for target in (20, 60, 120):
            await wait_until(lambda t=target: _stage_count(runtime, "store", t), timeout=30,
                             message=f"{target} items stored")
            await runtime.durable.script_flush()
        await wait_until(lambda: _finished(runtime, len(ids)), timeout=60,
                         message="every item through graph")
    await _exactly_once(runtime, ids)


@pytest.mark.single_instance
async def test_a_stalled_cache_does_not_hold_up_the_workers(runtime, redis_factory):
    """redis-cache SIGSTOPped: feed signals cannot go out, and each batch's PUBLISH must not
    wait on them (bounded, then skipped for a while): every item still finishes its stages.
    (Store and chunk only: embed's search-cache invalidation is another cache call.)"""
    cache_server = redis_factory("cache")
    cache = redis_clients.connect(cache_server.url, variable="GATEWAY_CACHE_URL")
    stalled = replace(runtime, cache=cache)
    assert await cache.ping()
    assert cache_server.proc is not None
    skipped_before = _signals("skipped")
    os.kill(cache_server.proc.pid, signal.SIGSTOP)
    try:
        for i in range(12):
            await queue.enqueue(runtime.durable, f"stall-{i}", {"text": f"document {i}"})
        async with _workers(stalled, concurrency=2, stages=("store", "chunk")):
            await wait_until(lambda: _chunked(runtime, 12), timeout=30,
                             message="every item chunked while redis-cache is stalled")
        # The batches behind the first timed-out PUBLISH skipped theirs instead of waiting.
        assert _signals("skipped") > skipped_before
    finally:
        os.kill(cache_server.proc.pid, signal.SIGCONT)
        await cache.aclose()


def _signals(result: str) -> float:
    return REGISTRY.get_sample_value("gateway_push_signals_total", {"result": result}) or 0.0


async def _chunked(runtime, count: int) -> bool:
    done = await runtime.pg.fetchval(
        "SELECT count(*) FROM pipeline_journal WHERE stage = 'chunk'")
    return bool(done == count)
