"""Pipeline benchmark: N items through store -> chunk -> embed -> graph with
no-op handlers (4N handler runs), one worker process, journaling and feed rows on as in
production, side by side in one invocation with:

- ``bare``: a bare Lua FETCH+COMPLETE chain with the same client (redis-py asyncio), no
  leases, journal or heartbeats: the ceiling of this client on this machine, one item per
  round trip (the issue's baseline); ``bare-batch``: the same popping up to ``--batch`` items
  per call and pushing them in one pipeline, the ceiling for the gateway's batching;
- ``saq`` and ``arq`` doing the same four-stage chain (each job enqueues the next), run in a
  separate virtualenv because both pin redis-py < 8 (created on first use under
  ``.gateway/bench-peers``; ``--no-peers`` skips them).

All runs use the same embedded redis-durable (flushed between runs). Also reports Redis
memory per queued item. Figures are recorded in docs/performance.md.

    python bench/pipeline.py [--items 5000] [--concurrency 2] [--batch 64] [--peer-concurrency 50]
                             [--rounds 1] [--costs] [--commandstats] [--no-peers]

``--rounds N`` runs gateway, bare, bare-batch, saq and arq N times interleaved, each round
starting at the next runner (each round's rates, gateway ÷ each runner and load are printed;
the medians over the rounds are the figures); every gateway run also prints its CPU per
item (this process, the Redis servers, PostgreSQL), which other load moves far less than
the rates. ``--costs`` adds a gateway run with ``bench/pipeline_costs.py``'s accounting: per
stage, the worker's CPU and its round trips to each store per item. ``--commandstats`` prints
redis-durable's ``INFO commandstats`` per item of every gateway run (each command's time and
calls, those a script makes included, inside the script's own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from bench import pipeline_costs
from bench.ingest import cpu_seconds, print_stats, reset_stats
from bench.scale import tree_cpu
from gateway.app.worker import run_workers
from gateway.config import Settings
from gateway.pipeline.handlers import StageContext
from gateway.pipeline.stages import STAGES, stats_key
from gateway.pipeline.worker import WorkerConfig
from gateway.stores import embedded
from gateway.stores import redis as redis_clients
from gateway.stores.migrate import migrate_url
from gateway.stores.runtime import open_runtime
from tests.pipeline.helpers import queue_add

ROOT = Path(__file__).resolve().parent.parent
PEERS_VENV = ROOT / ".gateway" / "bench-peers"
PEER_PACKAGES = ["arq==0.28.0", "saq[redis]==0.26.4", "redis[hiredis]>=5,<6", "typing_extensions"]

BARE_POP = """
local p = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[1]))
if #p == 0 then return false end
local out = {}
for i = 1, #p, 2 do out[#out + 1] = p[i] end
return out
"""
BARE_PUSH = "redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1]) return 1"


async def noop(ctx: StageContext) -> None:
    return None


async def _wait_graph_done(durable: Any, n: int) -> None:
    # Polling a Redis counter (10 ms) is the measurement here, not synchronisation.
    while int(await durable.hget(stats_key("graph"), "completed") or 0) < n:  # noqa: ASYNC110
        await asyncio.sleep(0.01)


async def _enqueue_all(durable: Any, n: int) -> None:
    for start in range(0, n, 500):
        async with durable.pipeline(transaction=False) as pipe:
            for i in range(start, min(n, start + 500)):
                await queue_add(pipe, f"item-{i}", {"text": f"document {i}"})
            await pipe.execute()


def store_cpu(servers: list[Any]) -> tuple[float, float]:
    """CPU seconds so far of the Redis servers and of PostgreSQL (postmaster and its live
    backends: read while the runtime's connections are open)."""
    redis_cpu = sum(cpu_seconds(s.proc.pid) for s in servers
                    if isinstance(s, embedded.RedisServer) and s.proc)
    pg_cpu = sum(tree_cpu(s.proc.pid) for s in servers
                 if isinstance(s, embedded.PostgresServer) and s.proc)
    return redis_cpu, pg_cpu


async def run_gateway(settings: Settings, n: int, concurrency: int, batch: int,
                      servers: list[Any], commandstats: bool = False,
                      ) -> tuple[float, tuple[float, float, float]]:
    """Seconds for n items, and CPU µs per item of (this process, Redis, PostgreSQL);
    ``commandstats``: redis-durable's commands per item printed."""
    runtime = await open_runtime(settings, pg_max_size=min(4 * concurrency, 40) + 2)
    try:
        await _reset(runtime)
        await _enqueue_all(runtime.durable, n)
        stop = asyncio.Event()
        config = WorkerConfig(lease=90, heartbeat=30, reclaim_interval=60, idle_max=0.05,
                              batch=batch)
        if commandstats:
            reset_stats(settings.durable_url)
        cpu_before = (time.process_time(), *store_cpu(servers))
        started = time.perf_counter()
        task = asyncio.create_task(run_workers(
            runtime, stop, concurrency=concurrency, config=config,
            handlers=dict.fromkeys(STAGES, noop)))
        await _wait_graph_done(runtime.durable, n)
        elapsed = time.perf_counter() - started
        cpu = tuple(1e6 * (after - before) / n for after, before in
                    zip((time.process_time(), *store_cpu(servers)), cpu_before, strict=True))
        if commandstats:
            print_stats(settings.durable_url, "gateway", n)
        stop.set()
        await task
        journaled = await runtime.pg.fetchval("SELECT count(*) FROM pipeline_journal")
        assert journaled == 4 * n, journaled
        return elapsed, (cpu[0], cpu[1], cpu[2])
    finally:
        await runtime.close()


async def _reset(runtime: Any) -> None:
    await runtime.durable.flushall()
    await runtime.pg.execute("TRUNCATE pipeline_journal, feed, feed_topics, feed_pending")


async def run_bare(url: str, n: int, concurrency: int, batch: int = 1) -> float:
    """The ceiling: per stage, ``concurrency`` loops of one EVALSHA pop of up to ``batch``
    items + their EVALSHA pushes (one round trip when batch is 1, pipelined otherwise)."""
    client = redis_clients.connect(url, variable="bench")
    try:
        await client.flushall()
        pop = client.register_script(BARE_POP)
        push: Any = client.register_script(BARE_PUSH)  # also called on a pipeline
        ready = [f"q:{{pipeline}}:bare:{s}" for s in STAGES] + ["q:{pipeline}:bare:done"]
        for start in range(0, n, 1000):
            await client.zadd(ready[0], {f"i{i}": i for i in range(start, min(n, start + 1000))})
        done = 0

        async def loop(stage: int) -> None:
            nonlocal done
            while done < n:
                items = await pop(keys=[ready[stage]], args=[batch])
                if not items:
                    await asyncio.sleep(0.001)
                    continue
                if len(items) == 1:
                    await push(keys=[ready[stage + 1]], args=[items[0], 1])
                else:
                    async with client.pipeline(transaction=False) as pipe:
                        for item in items:
                            await push(keys=[ready[stage + 1]], args=[item, 1], client=pipe)
                        await pipe.execute()
                if stage == len(STAGES) - 1:
                    done += len(items)

        started = time.perf_counter()
        await asyncio.gather(*(loop(s) for s in range(len(STAGES)) for _ in range(concurrency)))
        return time.perf_counter() - started
    finally:
        await client.aclose()


async def _used_memory(client: Any) -> int:
    return int((await client.info("memory"))["used_memory"])


async def memory_per_item(url: str, n: int) -> tuple[float, float, int, dict[str, float]]:
    """Bytes of Redis memory per item queued in store (payload included): the average over
    n items from empty and the marginal cost of n more (fixed costs such as the 1,024 dedup
    bucket keys excluded); the payload size; ``MEMORY USAGE`` per item of each kind of key
    (bucketed keys summed per kind) after the first n."""
    client = redis_clients.connect(url, variable="bench")
    try:
        await client.flushall()
        document = {"text": "x" * 100}
        before = await _used_memory(client)
        await _enqueue_all_doc(client, 0, n, document)
        after = await _used_memory(client)
        by_kind: dict[str, float] = {}
        async for key in client.scan_iter("q:*", count=1000):
            kind = key.split(":")[2]  # q:{pipeline}:<kind>[:...]
            used = int(await client.memory_usage(key, samples=0) or 0)
            by_kind[kind] = by_kind.get(kind, 0) + used / n
        await _enqueue_all_doc(client, n, 2 * n, document)
        marginal = (await _used_memory(client) - after) / n
        return ((after - before) / n, marginal,
                len(json.dumps(document, separators=(",", ":"))), by_kind)
    finally:
        await client.aclose()


async def _enqueue_all_doc(client: Any, first: int, end: int, document: dict[str, Any]) -> None:
    for start in range(first, end, 500):
        async with client.pipeline(transaction=False) as pipe:
            for i in range(start, min(end, start + 500)):
                await queue_add(pipe, f"item-{i:08d}", document)
            await pipe.execute()


PEER_SCRIPT = r'''
import asyncio, os, sys, time
kind, url, n, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
STAGES = ["store", "chunk", "embed", "graph"]

async def run_saq():
    from saq import Queue, Worker
    q = Queue.from_url(url, name="bench")
    done = asyncio.Event(); count = 0
    async def stage(ctx, *, i, s):
        nonlocal count
        if s + 1 < len(STAGES):
            await q.enqueue("stage", i=i, s=s + 1)
        else:
            count += 1
            if count >= n: done.set()
    await q.connect()
    for i in range(n):
        await q.enqueue("stage", i=i, s=0)
    w = Worker(q, functions=[("stage", stage)], concurrency=concurrency)
    t0 = time.perf_counter()
    task = asyncio.create_task(w.start())
    await done.wait()
    elapsed = time.perf_counter() - t0
    print(elapsed, flush=True)
    os._exit(0)  # skip the worker's shutdown grace period

async def run_arq():
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import Worker
    rs = RedisSettings.from_dsn(url)
    pool = await create_pool(rs)
    done = asyncio.Event(); count = 0
    async def stage(ctx, i, s):
        nonlocal count
        if s + 1 < len(STAGES):
            await ctx["redis"].enqueue_job("stage", i, s + 1)
        else:
            count += 1
            if count >= n: done.set()
    stage.__qualname__ = "stage"
    for i in range(n):
        await pool.enqueue_job("stage", i, 0)
    w = Worker(functions=[stage], redis_pool=pool, max_jobs=concurrency, poll_delay=0.01,
               keep_result=0, handle_signals=False)
    t0 = time.perf_counter()
    task = asyncio.create_task(w.async_run())
    await done.wait()
    elapsed = time.perf_counter() - t0
    print(elapsed, flush=True)
    os._exit(0)

asyncio.run(run_saq() if kind == "saq" else run_arq())
'''


def peers_python() -> Path:
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {PEERS_VENV} for saq and arq (they pin redis-py < 8) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    return python


def run_peer(kind: str, url: str, n: int, concurrency: int) -> float:
    redis_clients.connect(url, variable="bench")  # validates the URL only
    import redis

    redis.Redis.from_url(url).flushall()
    out = subprocess.run([str(peers_python()), "-c", PEER_SCRIPT, kind, url, str(n),
                          str(concurrency)], capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(f"{kind} run failed:\n{out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def _timed_gateway(settings: Settings, args: argparse.Namespace, servers: list[Any],
                   cpus: list[tuple[float, float, float]]) -> float:
    """Seconds of one gateway run; its CPU per item is appended to ``cpus``."""
    seconds, cpu = asyncio.run(
        run_gateway(settings, args.items, args.concurrency, args.batch, servers,
                    args.commandstats))
    cpus.append(cpu)
    return seconds


def run_round(runners: dict[str, Callable[[], float]], i: int) -> dict[str, float]:
    """Seconds of every runner once, starting at a different runner each round so that no
    runner always goes first (or right after the same neighbour); the load after it."""
    names = list(runners)
    order = names[i % len(names):] + names[:i % len(names)]
    seconds = {name: runners[name]() for name in order}
    return {**{name: seconds[name] for name in names}, "load": os.getloadavg()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=2,
                        help="gateway and bare: coroutines per stage")
    parser.add_argument("--batch", type=int, default=64, help="gateway: items per transaction")
    parser.add_argument("--peer-concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=1,
                        help="every runner this many times, interleaved")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--costs", action="store_true",
                        help="one more gateway run with per-stage CPU and round trips")
    parser.add_argument("--commandstats", action="store_true",
                        help="print redis-durable's INFO commandstats per item of each "
                             "gateway run")
    parser.add_argument("--memory-only", action="store_true",
                        help="only the memory-per-item measurement")
    args = parser.parse_args()
    n = args.items
    root = Path(tempfile.mkdtemp(prefix="gwbench-pipe-"))
    servers: list[Any] = []
    rounds: list[dict[str, float]] = []
    cpus: list[tuple[float, float, float]] = []
    costs: pipeline_costs.Costs | None = None
    try:
        durable = embedded.RedisServer("durable", root / "durable",
                                       embedded.new_password()).start()
        servers.append(durable)
        cache = embedded.RedisServer("cache", root / "cache", embedded.new_password()).start()
        servers.append(cache)
        pg = embedded.PostgresServer(root / "pg" / "data").start()
        servers.append(pg)
        asyncio.run(migrate_url(pg.url))
        settings = replace(Settings(), durable_url=durable.url, cache_url=cache.url,
                           database_url=pg.url)
        runners: dict[str, Callable[[], float]] = {
            "gateway": lambda: _timed_gateway(settings, args, servers, cpus),
            "bare": lambda: asyncio.run(run_bare(durable.url, n, args.concurrency)),
            "bare-batch": lambda: asyncio.run(run_bare(durable.url, n, args.concurrency,
                                                       args.batch)),
        }
        if not args.no_peers:
            for kind in ("saq", "arq"):
                runners[kind] = partial(run_peer, kind, durable.url, n, args.peer_concurrency)
        for i in range(0 if args.memory_only else args.rounds):
            rounds.append(run_round(runners, i))
        if args.costs:
            with pipeline_costs.measured({"redis-durable": durable.url, "redis-cache": cache.url,
                                          "postgres": pg.url}) as costs:
                asyncio.run(run_gateway(settings, n, args.concurrency, args.batch, servers))
        per_item, marginal, payload, by_kind = asyncio.run(
            memory_per_item(durable.url, n))
    finally:
        embedded.stop_all(servers)
    report(args, rounds, cpus, costs)
    print(f"  redis memory per queued item: {per_item:.0f} bytes incl. a {payload}-byte "
          f"payload ({per_item - payload:.0f} bytes overhead); the next {n} items: "
          f"{marginal:.0f} each ({marginal - payload:.0f} overhead)")
    print("  MEMORY USAGE per item by key kind: " + ", ".join(
        f"{kind} {size:.0f}" for kind, size in sorted(by_kind.items())))
    return 0


def median(values: list[float]) -> float:
    """The middle value (the upper one of an even count)."""
    return sorted(values)[len(values) // 2]


def report(args: argparse.Namespace, rounds: list[dict[str, float]],
           cpus: list[tuple[float, float, float]], costs: pipeline_costs.Costs | None) -> None:
    """Per round: each runner's rate, gateway ÷ each runner, the gateway's CPU per item, the
    load; then the medians over the rounds (the figures)."""
    n = args.items
    others = [name for name in (rounds[0] if rounds else {}) if name not in ("gateway", "load")]
    print(f"{n} items x 4 stages, gateway/bare concurrency {args.concurrency}/stage, "
          f"peers {args.peer_concurrency}")
    for i, (r, (worker, redis_cpu, pg_cpu)) in enumerate(zip(rounds, cpus, strict=True)):
        print(f"  round {i + 1} (load {r['load']:.1f}): items/s " + ", ".join(
            f"{name} {n / r[name]:.0f}" for name in ("gateway", *others)))
        print("    gateway / " + ", ".join(
            f"{name} {r[name] / r['gateway']:.2f}" for name in others))
        print(f"    gateway CPU per item: worker {worker:.0f} us, redis {redis_cpu:.0f}, "
              f"postgres {pg_cpu:.0f}, all {worker + redis_cpu + pg_cpu:.0f}")
    if rounds:
        print(f"  median of {len(rounds)} round(s): items/s " + ", ".join(
            f"{name} {median([n / r[name] for r in rounds]):.0f}"
            for name in ("gateway", *others)))
        print("    gateway / " + ", ".join(
            f"{name} {median([r[name] / r['gateway'] for r in rounds]):.2f}"
            for name in others))
        print("    gateway CPU per item: " + ", ".join(
            f"{name} {median([c[k] for c in cpus]):.0f} us" for k, name in
            enumerate(("worker", "redis", "postgres"))) +
              f", all {median([sum(c) for c in cpus]):.0f} us")
    if costs is not None:
        print("  per stage (a run of its own, callbacks timed): worker CPU and round trips "
              "per item")
        print("\n".join(costs.table(n)))


if __name__ == "__main__":
    raise SystemExit(main())
