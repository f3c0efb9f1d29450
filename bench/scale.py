"""Scale benchmark: throughput with several ``gateway worker`` and ``gateway
serve`` processes, on one Redis per role and on local three-master clusters, with the ratio
to one process and where the CPU went.

* pipeline: ``--items`` documents (default handlers) through store -> chunk -> embed ->
  graph, with 1, 2 and 4 worker processes; the clock runs from the first enqueue to the last
  graph completion, the workers being ready (model loaded, their ready line logged) before
  it starts.
* ingest: signed webhooks per second with 1 and 2 serve processes, one ``wrk`` per process
  (bench/ingest.py's script, signer and parser), each with ``--connections`` / processes;
  then with one ``gateway serve --processes N`` (N processes on one port, SO_REUSEPORT) and
  one ``wrk`` with every connection.

Every configuration runs in this one invocation on the same machine, so ratios compare like
with like. CPU is read from /proc for the gateway processes, the Redis nodes (all nodes of a
cluster) and PostgreSQL (postmaster and its backends) over the measured window; each
pipeline run also prints that CPU in ms per item (robust to other load, unlike the rates),
PostgreSQL commits and WAL fsyncs per item, and redis-durable's commands per item; with
``--statements``, pg_stat_statements' busiest statements (calls per item, mean ms).

    python bench/scale.py [--items 3000] [--duration 5] [--workers 1,2,4] [--serves 1,2]
                          [--processes 1,2] [--batch N] [--statements]
    python bench/scale.py --serves "" --processes "" --topologies single   # pipeline only
    python bench/scale.py --workers 1 --serves 1 --profile /tmp/prof   # py-spy stacks
    python bench/scale.py --busy-ms 1 --items 2000 --serves "" --processes "" \
        --topologies single   # handlers that work in the worker (bench/busy_handlers.py)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import ingest
from gateway.pipeline.stages import STAGES, stats_key
from gateway.stores import embedded
from gateway.stores import redis as redis_clients
from gateway.stores.migrate import migrate_url
from tests.pipeline.helpers import queue_add
from tests.topology import LocalCluster

CLK = os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its live descendants (PostgreSQL's backends)."""
    total = 0.0
    with contextlib.suppress(OSError):
        total += ingest.cpu_seconds(pid)
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        total += sum(tree_cpu(int(child)) for child in children)
    return total


@dataclass
class Stores:
    """One topology's stores: URLs plus the pids whose CPU counts as Redis / PostgreSQL."""

    name: str
    durable_url: str
    cache_url: str
    database_url: str
    redis_pids: list[int]
    pg_pid: int

    def env(self) -> dict[str, str]:
        return {**os.environ, "GATEWAY_DURABLE_URL": self.durable_url,
                "GATEWAY_CACHE_URL": self.cache_url, "GATEWAY_DATABASE_URL": self.database_url,
                "GATEWAY_HOST": "127.0.0.1", "GATEWAY_WEBHOOK_SECRETS": f"bench={ingest.SECRET}"}


@dataclass
class Cpu:
    """CPU seconds per component over one measured window."""

    gateway: float
    redis: float
    postgres: float
    machine: float = 0.0
    wrk: float = 0.0

    def line(self, wall: float) -> str:
        load = f"  wrk {self.wrk / wall:4.0%}" if self.wrk else ""
        return (f"CPU: gateway {self.gateway / wall:4.0%}  redis {self.redis / wall:4.0%}  "
                f"postgres {self.postgres / wall:4.0%}{load} (of one core); machine busy "
                f"{self.machine / wall:4.0%} of {os.cpu_count()} cores")


def machine_busy() -> float:
    """CPU seconds all cores spent not idle (first line of /proc/stat): other engineers'
    processes included, which is what a shared machine leaves us."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / CLK


class CpuMeter:
    def __init__(self, stores: Stores, pids: Sequence[int]) -> None:
        self.stores, self.pids = stores, list(pids)
        self.start = self._read()

    def _read(self) -> Cpu:
        return Cpu(sum(tree_cpu(p) for p in self.pids),  # a supervisor's children too
                   sum(ingest.cpu_seconds(p) for p in self.stores.redis_pids),
                   tree_cpu(self.stores.pg_pid), machine_busy())

    def stop(self) -> Cpu:
        end = self._read()
        return Cpu(end.gateway - self.start.gateway, end.redis - self.start.redis,
                   end.postgres - self.start.postgres, end.machine - self.start.machine)


@contextlib.contextmanager
def gateway_processes(runs: Sequence[tuple[dict[str, str], list[str]]], env: dict[str, str],
                      root: Path, tag: str) -> Iterator[list[int]]:
    """Several ``gateway`` processes (bench/ingest.py's process manager): (extra env, argv)
    each; yields their pids."""
    with contextlib.ExitStack() as stack:
        pids = []
        for n, (extra, argv) in enumerate(runs):
            proc = stack.enter_context(ingest.process(
                [sys.executable, "-m", "gateway.cli", *argv], {**env, **extra},
                root / f"{tag}-{n}.log"))
            pids.append(proc.pid)
        yield pids


def wait_logged(logs: Sequence[Path], text: str, timeout: float = 60.0,
                count: int = 1) -> None:
    deadline = time.monotonic() + timeout
    while not all(log.exists() and log.read_text(errors="replace").count(text) >= count
                  for log in logs):
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {text!r} not logged by every process within {timeout} s")
        time.sleep(0.05)


async def _reset(stores: Stores) -> None:
    for url in (stores.durable_url, stores.cache_url):
        client = redis_clients.connect(url, variable="bench")
        await client.flushall()
        await client.aclose()
    import asyncpg

    conn = await asyncpg.connect(stores.database_url)
    await conn.execute("TRUNCATE pipeline_journal, pipeline_documents, pipeline_chunks, "
                       "pipeline_edges, feed, feed_topics, feed_pending")
    await conn.close()


_WAITS = """
SELECT count(*) FILTER (WHERE wait_event_type = 'Lock') AS locked,
       count(*) FILTER (WHERE state = 'active') AS active
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


async def sample_locks(database_url: str, done: asyncio.Event) -> tuple[float, float]:
    """Mean PostgreSQL backends (active, waiting on a lock) every 20 ms: how many workers'
    transactions queue behind the ``pipeline`` feed topic's counter row."""
    import asyncpg

    conn = await asyncpg.connect(database_url)
    samples: list[tuple[int, int]] = []
    try:
        while not done.is_set():
            row = await conn.fetchrow(_WAITS)
            samples.append((row["active"], row["locked"]))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.02)
    finally:
        await conn.close()
    count = max(1, len(samples))
    return sum(a for a, _ in samples) / count, sum(w for _, w in samples) / count


@dataclass
class Timeline:
    """The run without its fill (the first items must pass four stages before any finishes)
    and its drain (the last items' stages run one after another): stage completions of all
    four stages counted together, the rate between 10 % and 90 % of them (divided by four:
    items/s), which is what a steady stream of documents gets; and when the graph stage
    passed 10 % of the items."""

    first_tenth: float  # graph completions reach 10 % of the items
    steady: float  # items/s: stage completions / 4 between 10 % and 90 % of all of them


def timeline(samples: Sequence[tuple[float, int, int]], items: int) -> Timeline:
    """``samples``: (seconds, graph completions, every stage's completions)."""
    total = items * len(STAGES)
    low = next(s for s in samples if s[2] >= total * 0.1)
    high = next(s for s in samples if s[2] >= total * 0.9)
    steady = (high[2] - low[2]) / len(STAGES) / (high[0] - low[0]) if high[0] > low[0] else 0.0
    return Timeline(next(s[0] for s in samples if s[1] >= items * 0.1), steady)


async def _enqueue_and_wait(stores: Stores, items: int, tag: str
                            ) -> tuple[float, tuple[float, float], Timeline]:
    durable = redis_clients.connect(stores.durable_url, variable="bench")
    done = asyncio.Event()
    sampler = asyncio.create_task(sample_locks(stores.database_url, done))
    try:
        started = time.perf_counter()
        for first in range(0, items, 500):
            async with durable.pipeline(transaction=False) as pipe:
                for i in range(first, min(items, first + 500)):
                    await queue_add(pipe, f"{tag}-{i}", {
                        "text": f"Document {i}: see https://docs.test/{i} #scale @bench "
                                + "lorem ipsum " * 20})
                await pipe.execute()
        # Polling a counter every 20 ms is the measurement, not synchronisation.
        samples: list[tuple[float, int, int]] = []
        while not samples or samples[-1][1] < items:
            async with durable.pipeline(transaction=False) as pipe:
                for stage in STAGES:
                    pipe.hget(stats_key(stage), "completed")
                done_by_stage = [int(n or 0) for n in await pipe.execute()]
            samples.append((time.perf_counter() - started, done_by_stage[-1],
                            sum(done_by_stage)))
            if done_by_stage[-1] < items:
                await asyncio.sleep(0.02)
        elapsed = samples[-1][0]
        done.set()
        return elapsed, await sampler, timeline(samples, items)
    finally:
        done.set()
        await durable.aclose()


_COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
# WAL fsyncs: pg_stat_io from PostgreSQL 18 on (the embedded one), pg_stat_wal before.
_SYNCS = ("SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal'",
          "SELECT wal_sync FROM pg_stat_wal")


async def pg_counters(database_url: str, reset: bool = False) -> dict[str, float]:
    """Commits of the database and WAL syncs of the server so far; with ``reset``,
    pg_stat_statements starts afresh (when it is loaded)."""
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        commits = float(await conn.fetchval(_COMMITS))
        syncs = float("nan")
        for query in _SYNCS:
            try:
                syncs = float(await conn.fetchval(query))
                break
            except asyncpg.PostgresError:
                continue
        if reset and await conn.fetchval(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"):
            await conn.execute("SELECT pg_stat_statements_reset()")
        return {"commits": commits, "syncs": syncs}
    finally:
        await conn.close()


async def redis_calls(durable_url: str) -> dict[str, int]:
    """Calls so far of each command on redis-durable (INFO commandstats)."""
    client = redis_clients.connect(durable_url, variable="bench")
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return {name.removeprefix("cmdstat_"): int(value["calls"])
            for name, value in stats.items() if isinstance(value, dict)}


async def top_statements(database_url: str, limit: int = 30) -> list[tuple[int, float, str]]:
    """(calls, total ms, query) of the busiest statements since the reset, when
    pg_stat_statements is loaded (``--statements``)."""
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        if not await conn.fetchval(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"):
            return []
        rows = await conn.fetch(
            "SELECT calls, total_exec_time, query FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " ORDER BY calls DESC LIMIT $1", limit)
        return [(r["calls"], r["total_exec_time"], " ".join(r["query"].split()))
                for r in rows]
    finally:
        await conn.close()


@dataclass
class PipelineResult:
    rate: float
    cpu: Cpu
    wall: float
    waits: tuple[float, float]
    times: Timeline
    commits: float  # PostgreSQL commits per item
    syncs: float  # WAL syncs per item
    statements: list[tuple[int, float, str]]
    redis: dict[str, int]  # redis-durable commands over the run


def pipeline_run(stores: Stores, workers: int, items: int, concurrency: int,
                 root: Path, profile: str | None = None, batch: int = 0,
                 busy_ms: float = 0.0) -> PipelineResult:
    asyncio.run(_reset(stores))
    tag = f"pipe-{stores.name}-{workers}"
    extra: dict[str, str] = {}
    toml = f"[pipeline]\nbatch = {batch}\n" if batch else ""  # default: the worker's own
    if busy_ms:  # bench/busy_handlers.py: the default handlers after busy_ms of CPU each
        extra["BENCH_BUSY_MS"] = str(busy_ms)
        extra["PYTHONPATH"] = os.pathsep.join(filter(None, (
            str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH"))))
        toml += "[pipeline.handlers]\n" + "".join(
            f'{stage} = "bench.busy_handlers:{stage}"\n' for stage in STAGES)
    if toml:
        config = root / f"{tag}.toml"
        config.write_text(toml)
        extra["GATEWAY_CONFIG"] = str(config)
    runs = [(extra, ["worker", "--concurrency", str(concurrency)])] * workers
    if profile:
        Path(profile).mkdir(parents=True, exist_ok=True)
    with gateway_processes(runs, stores.env(), root, tag) as pids:
        wait_logged([root / f"{tag}-{n}.log" for n in range(workers)],
                    f"concurrency {concurrency}: ready")
        before = asyncio.run(pg_counters(stores.database_url, reset=True))
        calls = asyncio.run(redis_calls(stores.durable_url))
        spies = [subprocess.Popen(
            ["py-spy", "record", "--pid", str(pids[0]), "-r", "200", "-f", "raw",
             "--nonblocking", "-o", str(Path(profile) / f"{tag}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)] if profile else []
        meter = CpuMeter(stores, pids)
        elapsed, waits, times = asyncio.run(_enqueue_and_wait(stores, items, tag))
        cpu = meter.stop()
        for spy in spies:  # SIGINT: py-spy writes its stacks and exits
            spy.send_signal(2)
            spy.wait(30)
        after = asyncio.run(pg_counters(stores.database_url))
        statements = asyncio.run(top_statements(stores.database_url))
        calls_after = asyncio.run(redis_calls(stores.durable_url))
    return PipelineResult(items / elapsed, cpu, elapsed, waits, times,
                          (after["commits"] - before["commits"]) / items,
                          (after["syncs"] - before["syncs"]) / items, statements,
                          {k: v - calls.get(k, 0) for k, v in calls_after.items()
                           if v > calls.get(k, 0)})


def ingest_run(stores: Stores, serves: int, args: argparse.Namespace,
               root: Path, processes: int = 1) -> tuple[float, Cpu, dict[int, int]]:
    """``serves`` serve processes on their own ports, one wrk each; or (``processes`` > 1)
    one ``gateway serve --processes N`` on one port and one wrk."""
    asyncio.run(_reset(stores))
    tag = f"ingest-{stores.name}-{serves}x{processes}"
    ports = [embedded.free_port() for _ in range(serves)]
    argv = ["serve", "--processes", str(processes)] if processes > 1 else ["serve"]
    # No per-source quota: nothing drains the queue here, so the warm-up and the measured
    # seconds would reach it and the run would measure 429s.
    config = root / "ingest.toml"
    config.write_text("[quotas]\nitems_per_source = 0\nbytes_per_source = 0\n")
    runs = [({"GATEWAY_PORT": str(port), "GATEWAY_CONFIG": str(config)}, argv)
            for port in ports]
    timestamp = int(time.time())
    script, body = root / "signed.lua", root / "body.json"
    script.write_text(ingest.WRK_SCRIPT)
    body.write_bytes(ingest.BODY)
    per_conn = max(1, args.connections // serves)
    with gateway_processes(runs, stores.env(), root, tag) as pids:
        for port in ports:
            ingest.wait_http(f"http://127.0.0.1:{port}/healthz")
        # Every child of a supervisor logs its own "serving on" line once it listens.
        wait_logged([root / f"{tag}-{n}.log" for n in range(serves)], "serving on",
                    count=processes)
        ids = []
        for n, port in enumerate(ports):
            warm, measure = root / f"{tag}-warm-{n}", root / f"{tag}-ids-{n}"
            ingest.sign_file(warm, f"{tag}-w{n}", 20_000, timestamp)
            ingest.sign_file(measure, f"{tag}-m{n}", args.ids, timestamp)
            ids.append((port, warm, measure))

        def load(phase: int, seconds: int, meter_box: list[Any]) -> list[ingest.Result]:
            results: list[ingest.Result] = [None] * serves  # type: ignore[list-item]

            def one(n: int) -> None:
                port, warm, measure = ids[n]
                results[n] = ingest.run_wrk(
                    f"http://127.0.0.1:{port}/v1/webhooks/bench", script,
                    (warm, measure)[phase], timestamp, body, seconds, per_conn,
                    args.load_core, f"serve{n}")
            threads = [threading.Thread(target=one, args=(n,)) for n in range(serves)]
            meter_box.append(CpuMeter(stores, pids))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return results

        load(0, args.warmup, [])
        if args.profile:
            profile_first(pids[0], args.duration, Path(args.profile) / f"{tag}.txt")
        box: list[CpuMeter] = []
        results = load(1, args.duration, box)
        cpu = box[0].stop()
    # Each wrk's share is read from RUSAGE_CHILDREN, which the concurrent wrks share: the
    # largest reading is the closest to their total.
    cpu.wrk = max(r.load_cpu for r in results) * args.duration
    statuses: dict[int, int] = {}
    for result in results:
        for code, count in result.statuses.items():
            statuses[code] = statuses.get(code, 0) + count
    return sum(r.rps for r in results), cpu, statuses


def profile_first(pid: int, seconds: int, out: Path) -> None:
    """py-spy on one serve process over the measured window (collapsed stacks), in the
    background: it stops by itself after ``seconds``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.Popen(["py-spy", "record", "--pid", str(pid), "-d", str(seconds), "-r", "200",
                      "-f", "raw", "--nonblocking", "-o", str(out)],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _execute(url: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def start_stores(kind: str, root: Path, started: list[Any],
                 statements: bool = False) -> Stores:
    pg = embedded.PostgresServer(root / kind / "pg" / "data").start()
    if statements:  # loaded at start only: set it, restart on the same data and port
        asyncio.run(_execute(pg.url, "ALTER SYSTEM SET shared_preload_libraries = "
                             "'pg_stat_statements'"))
        pg.stop()
        pg.start()
        asyncio.run(_execute(pg.url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
    started.append(pg)
    asyncio.run(migrate_url(pg.url))
    assert pg.proc is not None
    if kind == "single":
        redis = [embedded.RedisServer(role, root / kind / role, embedded.new_password()).start()
                 for role in ("durable", "cache")]
        started.extend(redis)
        return Stores(kind, redis[0].url, redis[1].url, pg.url,
                      [s.proc.pid for s in redis if s.proc], pg.proc.pid)
    clusters = [LocalCluster(role, root / kind / role, embedded.new_password()).start()
                for role in ("durable", "cache")]
    started.extend(clusters)
    return Stores(kind, clusters[0].url, clusters[1].url, pg.url,
                  [n.proc.pid for c in clusters for n in c.nodes if n.proc], pg.proc.pid)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=4, help="per worker process")
    parser.add_argument("--batch", type=int, default=0,
                        help="[pipeline] batch of the workers (default: theirs, up to 32)")
    parser.add_argument("--busy-ms", type=float, default=0.0,
                        help="each stage's handler first spins this many ms of CPU per item "
                             "(bench/busy_handlers.py): work in the worker, not the stores")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--serves", default="1,2")
    parser.add_argument("--processes", default="1,2",
                        help="ingest by one `gateway serve --processes N` on one port")
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--connections", type=int, default=64, help="in total")
    parser.add_argument("--ids", type=int, default=100_000, help="pre-signed ids per wrk")
    parser.add_argument("--load-core", type=int, default=1)
    parser.add_argument("--topologies", default="single,cluster")
    parser.add_argument("--profile", metavar="DIR",
                        help="py-spy each ingest run's first serve process and each pipeline "
                             "run's first worker, stacks into DIR")
    parser.add_argument("--statements", action="store_true",
                        help="load pg_stat_statements; print each pipeline run's busiest "
                             "statements (calls per item, mean ms)")
    args = parser.parse_args()
    serves = [int(s) for s in args.serves.split(",") if s]
    processes = [int(n) for n in args.processes.split(",") if n]
    if (serves or processes) and not shutil.which("wrk"):
        raise SystemExit("bench: needs wrk (apt-get install -y wrk)")
    root = Path(tempfile.mkdtemp(prefix="gws-"))
    started: list[Any] = []
    print(f"{os.cpu_count()} cores; items={args.items} concurrency={args.concurrency}/worker "
          f"batch={args.batch or 'default'} busy={args.busy_ms:g} ms/stage; "
          f"wrk -t1 on core {args.load_core}, {args.connections} connections in total, "
          f"{args.duration} s")
    try:
        for kind in args.topologies.split(","):
            stores = start_stores(kind, root, started, args.statements)
            base = steady_base = 0.0
            for workers in (int(w) for w in args.workers.split(",") if w):
                run = pipeline_run(stores, workers, args.items, args.concurrency, root,
                                   args.profile, args.batch, args.busy_ms)
                base = base or run.rate
                steady_base = steady_base or run.times.steady
                active, locked = run.waits
                per = 1000 / args.items  # CPU seconds -> ms per item
                print(f"{kind:<7} pipeline {workers} worker(s): {run.rate:7.0f} items/s "
                      f"(x{run.rate / base:4.2f})  {run.cpu.line(run.wall)}; PostgreSQL "
                      f"backends active {active:4.1f}, waiting on a lock {locked:4.1f}",
                      flush=True)
                print(f"        CPU per item: gateway {run.cpu.gateway * per:.2f} ms, "
                      f"postgres {run.cpu.postgres * per:.2f}, redis {run.cpu.redis * per:.2f}"
                      f", ours {(run.cpu.gateway + run.cpu.postgres + run.cpu.redis) * per:.2f}"
                      f"; per item {run.commits:.2f} commits, {run.syncs:.2f} WAL syncs; "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
                print(f"        steady {run.times.steady:.0f} items/s (x"
                      f"{run.times.steady / steady_base:4.2f}; stage completions / 4 between "
                      f"10 % and 90 % of them); 10 % of the items through graph after "
                      f"{run.times.first_tenth:.2f} s of {run.wall:.2f} s", flush=True)
                busiest = sorted(run.redis.items(), key=lambda kv: -kv[1])[:6]
                print("        redis-durable calls per item: " + ", ".join(
                    f"{name} {count / args.items:.2f}" for name, count in busiest), flush=True)
                for calls, total_ms, query in run.statements:
                    print(f"          {calls / args.items:6.2f}/item {total_ms / calls:7.3f} ms"
                          f"  {query[:110]}", flush=True)
            base = 0.0
            for count in serves:
                rps, cpu, statuses = ingest_run(stores, count, args, root)
                base = base or rps
                codes = " ".join(f"{k}:{v}" for k, v in sorted(statuses.items()))
                print(f"{kind:<7} ingest   {count} serve(s):  {rps:7.0f} req/s   "
                      f"(x{rps / base:4.2f})  {cpu.line(args.duration)}  {codes}", flush=True)
            base = 0.0
            for count in processes:
                rps, cpu, statuses = ingest_run(stores, 1, args, root, count)
                base = base or rps
                codes = " ".join(f"{k}:{v}" for k, v in sorted(statuses.items()))
                print(f"{kind:<7} ingest   --processes {count}: {rps:7.0f} req/s   "
                      f"(x{rps / base:4.2f})  {cpu.line(args.duration)}  {codes}", flush=True)
    finally:
        for server in reversed(started):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
