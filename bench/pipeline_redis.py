"""The pipeline's Redis cost per stage run, alone: N items queued in store, then each stage
drained in turn by one loop of FETCH (up to ``--batch`` items) and COMPLETE of the batch
(``queue.fetch_many`` and ``queue.complete_many``, as the worker calls them), with no
handler, journal or PostgreSQL. Prints, per stage run (4 per item), redis-durable's CPU (user
+ system, as the server counts it: other load on the machine moves it far less than a rate),
this process's CPU and redis-durable's ``INFO commandstats`` (each command's time and calls,
those a script makes included, inside the script's own).

    python bench/pipeline_redis.py [--items 5000] [--batch 64] [--rounds 3]
                                   [--tree DIR ...] [--callgrind]

``--tree`` (repeatable): run each round once per tree, in turn (each round starting at the
next tree), the queue code taken from that tree (``PYTHONPATH``): an A/B of script changes
against the same redis-durable, the medians per tree at the end. ``--callgrind``: redis-durable
runs under valgrind's callgrind and each run also counts its instructions per stage run
(repeatable under any load; slow, so use fewer ``--items``).
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
from pathlib import Path
from typing import Any

from gateway.stores import embedded
from gateway.stores.embedded import RedisServer

ROOT = Path(__file__).resolve().parent.parent


class CallgrindServer(RedisServer):
    """redis-durable under callgrind, counting from the start (``-z`` zeroes the count)."""

    def command(self) -> list[str]:
        return ["valgrind", "--tool=callgrind", "--dump-instr=no",
                f"--callgrind-out-file={self.data_dir / 'callgrind.out'}", *super().command()]


def instructions(pid: int | None, out: Path | None, zero: bool) -> int:
    """Zero the server's count, or dump it and answer the instructions since the zero."""
    if pid is None or out is None:
        return 0
    if zero:
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
        return 0
    before = set(out.parent.glob(out.name + "*"))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    dump = max(set(out.parent.glob(out.name + "*")) - before, key=lambda p: p.stat().st_mtime)
    for line in dump.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


async def drain(url: str, n: int, batch: int, pid: int | None = None,
                out: Path | None = None) -> dict[str, Any]:
    """One run against ``url`` with the queue code this process imports; with ``pid``
    (a callgrind server) and its ``out`` file, its instructions too."""
    from gateway.pipeline import queue
    from gateway.pipeline.stages import STAGES
    from gateway.pipeline.worker import worker_id
    from gateway.stores import redis as redis_clients
    from tests.pipeline.helpers import queue_add

    client = redis_clients.connect(url, variable="bench")
    try:
        await client.flushall()
        for start in range(0, n, 500):
            async with client.pipeline(transaction=False) as pipe:
                for i in range(start, min(n, start + 500)):
                    await queue_add(pipe, f"item-{i}", {"text": f"document {i}"})
                await pipe.execute()
        worker = worker_id()  # its length decides the lease hash's encoding, as in a worker
        await queue.fetch_many(client, "graph", worker, 90_000, 1)  # scripts loaded
        await client.config_resetstat()
        instructions(pid, out, zero=True)
        before = await client.info("cpu")
        cpu = time.process_time()
        for stage in STAGES:
            while leases := await queue.fetch_many(client, stage, worker, 90_000, batch):
                results = await queue.complete_many(client, leases)
                assert all(r is queue.LeaseResult.OK for r in results), results
        cpu = time.process_time() - cpu
        counted = instructions(pid, out, zero=False)
        after = await client.info("cpu")
        stats = await client.info("commandstats")
        done = int(await client.hget(f"q:{{pipeline}}:stats:{STAGES[-1]}", "completed") or 0)
        assert done == n, done
        runs = 4 * n
        redis_cpu = sum(float(after[k]) - float(before[k])
                        for k in ("used_cpu_user", "used_cpu_sys"))
        return {"redis_us": 1e6 * redis_cpu / runs, "client_us": 1e6 * cpu / runs,
                "instructions": counted / runs,
                "commands": {k.removeprefix("cmdstat_"): (v["usec"] / runs, v["calls"] / runs)
                             for k, v in stats.items()}}
    finally:
        await client.aclose()


def run_tree(tree: str, server: RedisServer, n: int, batch: int,
             callgrind: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": tree}
    grind = (["--pid", str(server.proc.pid), "--out", str(server.data_dir / "callgrind.out")]
             if callgrind and server.proc else [])
    out = subprocess.run([sys.executable, __file__, "--one", server.url, "--items", str(n),
                          "--batch", str(batch), *grind], env=env, capture_output=True,
                         text=True, check=False, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", action="append", default=[])
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(drain(args.one, args.items, args.batch, args.pid,
                                           args.out))))
        return 0
    trees = args.tree or [os.environ.get("PYTHONPATH") or str(ROOT)]
    kind = CallgrindServer if args.callgrind else RedisServer
    server = kind("durable", Path(tempfile.mkdtemp(prefix="gwbench-pr-")),
                  embedded.new_password()).start(timeout=120)
    results: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
    try:
        for i in range(args.rounds):
            order = trees[i % len(trees):] + trees[:i % len(trees)]
            for tree in order:
                r = run_tree(tree, server, args.items, args.batch, args.callgrind)
                results[tree].append(r)
                print(f"round {i + 1} {tree} (load {os.getloadavg()[0]:.1f}): per stage run "
                      f"redis {r['redis_us']:.1f} us, client {r['client_us']:.1f} us"
                      + (f", {r['instructions']:.0f} instructions" if args.callgrind else ""),
                      flush=True)
    finally:
        embedded.stop_all([server])
    for tree, runs in results.items():
        def med(values: list[float]) -> float:
            return sorted(values)[len(values) // 2]
        commands = runs[len(runs) // 2]["commands"]
        print(f"{tree}: median per stage run: redis {med([r['redis_us'] for r in runs]):.1f} "
              f"us, client {med([r['client_us'] for r in runs]):.1f} us, "
              f"{med([r['instructions'] for r in runs]):.0f} redis instructions; "
              "commands (us, calls) "
              "of one run: " + ", ".join(
                  f"{cmd} {us:.2f} x{calls:.3f}" for cmd, (us, calls) in
                  sorted(commands.items(), key=lambda kv: -kv[1][0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
