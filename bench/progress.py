"""What each owner's own progress topic costs the pipeline: every stage completion is written
to the operators' ``pipeline`` topic and to ``pipeline:<owner>`` (two feed rows, and a
numbering pass per topic a batch touched), against ``pipeline`` alone, the way it was before
topics per owner. One worker process, journal and feed as in production,
the three runs interleaved over ``--rounds`` (best of each: the machine is shared):

- ``pipeline only``: one feed row per completion (the baseline);
- ``+ owner, 1 owner``: every item of one owner (one more topic per batch);
- ``+ owner, N owners``: items spread over ``--owners`` API keys' namespaces, so a batch of
  ``--batch`` items touches up to that many topics (numbered in the pass of ``pipeline``).

The default handlers (store, chunk, the local model's embed, graph) on one-chunk documents;
``--noop``: no-op handlers, where the feed rows are most of each item's work (the worst case).

    python bench/progress.py [--items 3000] [--owners 16] [--batch 32] [--concurrency 2]
                             [--rounds 3] [--noop]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

from pipeline import _wait_graph_done, noop  # sibling bench script
from scale import tree_cpu  # sibling bench script
from stores import embedded_runtime, run_in_tempdir  # sibling bench script

from gateway.app.worker import run_workers
from gateway.pipeline import worker
from gateway.pipeline.stages import STAGES
from gateway.pipeline.worker import FEED_TOPIC, WorkerConfig
from gateway.stores.runtime import Runtime
from tests.pipeline.helpers import queue_add

OWNER_TOPICS = worker.feed_topics
# A short document (one chunk) with a link, a mention and a tag for the graph stage.
TEXT = ("Document %d: the quarterly report for @finance, see https://example.com/q3 and "
        "the #budget notes; totals were reconciled against the ledger.")


def operators_only(item_id: str) -> tuple[str, ...]:
    return (FEED_TOPIC,)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def _postmaster(rt: Runtime) -> int:
    return _parent(int(await rt.pg.fetchval("SELECT pg_backend_pid()")))


async def _cpu(rt: Runtime, postmaster: int) -> tuple[float, float, float]:
    """CPU seconds so far of this process (the worker and its model thread), PostgreSQL
    (every backend) and both Redis instances."""
    redis = 0.0
    for client in (rt.durable, rt.cache):
        info = await client.info("cpu")
        redis += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return time.process_time(), tree_cpu(postmaster), redis


async def one_run(rt: Runtime, items: int, owners: int, per_owner: bool,
                  concurrency: int, batch: int, noop_handlers: bool) -> tuple[
                      float, int, tuple[float, ...]]:
    """Seconds for ``items`` through the four stages; feed rows written; CPU seconds of
    the worker, PostgreSQL and Redis meanwhile."""
    await rt.durable.flushall()
    await rt.pg.execute("TRUNCATE pipeline_journal, pipeline_documents, pipeline_chunks, "
                        "pipeline_edges, feed, feed_topics, feed_pending")
    for start in range(0, items, 500):
        async with rt.durable.pipeline(transaction=False) as pipe:
            for i in range(start, min(items, start + 500)):
                # API keys' namespaces (k.<hex id>), so each item's owner is one of them.
                await queue_add(pipe, f"k.{i % owners:x}/item-{i}", {"text": TEXT % i})
            await pipe.execute()
    worker.feed_topics = OWNER_TOPICS if per_owner else operators_only
    stop = asyncio.Event()
    config = WorkerConfig(lease=90, heartbeat=30, reclaim_interval=60, idle_max=0.05,
                          batch=batch)
    postmaster = await _postmaster(rt)
    cpu_before = await _cpu(rt, postmaster)
    started = time.perf_counter()
    task = asyncio.create_task(run_workers(
        rt, stop, concurrency=concurrency, config=config,
        handlers=dict.fromkeys(STAGES, noop) if noop_handlers else None))
    await _wait_graph_done(rt.durable, items)
    elapsed = time.perf_counter() - started
    cpu = tuple(b - a for a, b in zip(cpu_before, await _cpu(rt, postmaster), strict=True))
    stop.set()
    await task
    worker.feed_topics = OWNER_TOPICS
    rows = int(await rt.pg.fetchval("SELECT count(*) FROM feed"))
    return elapsed, rows, cpu


async def run(args: argparse.Namespace, root: Path) -> None:
    runs: dict[str, list[float]] = {}
    cpus: dict[str, list[tuple[float, ...]]] = {}
    rows: dict[str, int] = {}
    cases: list[tuple[str, int, bool]] = [
        ("pipeline only", args.owners, False), ("+ owner, 1 owner", 1, True),
        (f"+ owner, {args.owners} owners", args.owners, True)]
    async with embedded_runtime(root, pg_max_size=4 * args.concurrency + 2) as rt:
        print(f"load at start {os.getloadavg()[0]:.2f}; {args.items} items x 4 stages, "
              f"{'no-op' if args.noop else 'default'} handlers, batch {args.batch}, "
              f"concurrency {args.concurrency}/stage, best of {args.rounds}")
        for _ in range(args.rounds):
            for name, owners, per_owner in cases:
                seconds, written, cpu = await one_run(rt, args.items, owners, per_owner,
                                                      args.concurrency, args.batch, args.noop)
                runs.setdefault(name, []).append(seconds)
                cpus.setdefault(name, []).append(cpu)
                rows[name] = written
    base = min(runs["pipeline only"])
    # CPU per item (median of the rounds): hardly moved by other work on the machine, unlike
    # the rates.
    per_item = {name: [statistics.median(c[i] for c in cpus[name]) / args.items * 1e6
                       for i in range(3)] for name, _, _ in cases}
    base_cpu = sum(per_item["pipeline only"])
    for name, _, _ in cases:
        best = min(runs[name])
        worker_us, pg_us, redis_us = per_item[name]
        total = worker_us + pg_us + redis_us
        print(f"  {name:20s} {args.items / best:7.0f} items/s  ({best:.2f} s, "
              f"{rows[name]} feed rows)  x{base / best:.2f} of pipeline only\n"
              f"      CPU per item: worker {worker_us:5.0f} us, postgres {pg_us:5.0f}, redis "
              f"{redis_us:4.0f}, all {total:5.0f} ({total - base_cpu:+.0f} us, "
              f"x{total / base_cpu:.2f})")
    print(f"  load at end {os.getloadavg()[0]:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--owners", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32, help="items per transaction")
    parser.add_argument("--concurrency", type=int, default=2, help="loops per stage")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--noop", action="store_true",
                        help="no-op handlers: the feed rows are most of the work")
    run_in_tempdir(run, parser.parse_args())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

