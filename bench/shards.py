"""Sharded queues on a local three-master cluster: where the queue commands land and what
sharding does to throughput.

Per run, on fresh keys: the pipeline load (``--items`` documents enqueued by ADD with
``--concurrency`` in flight, while ``--loops`` worker loops per stage FETCH batches of
``--batch`` and COMPLETE them through store -> chunk -> embed -> graph; handlers do nothing,
so the queue is all that is measured) and the inbox load (``--messages`` chat messages over
``--chats`` chats pushed with ``--concurrency`` in flight, while ``--loops`` consumers TAKE
chats and ACK their entries in order). Runs alternate between one tag (shards = 1, today's
layout) and ``--shards`` tags, ``--rounds`` times. ``INFO commandstats`` of every master
before and after a run gives each master's share of the run's commands (the queue's: nothing
else runs); the last line says whether any master carried more than half.

    python bench/shards.py [--items 3000] [--messages 3000] [--chats 300] [--shards 3]
                           [--rounds 2] [--loops 4] [--batch 32] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cluster import lanes
from gateway.conversations.model import Incoming
from gateway.inbox.entry import Entry
from gateway.inbox.queue import Inbox
from gateway.pipeline import queue
from gateway.pipeline.stages import STAGES
from gateway.stores import embedded, shards
from gateway.stores import redis as redis_clients
from tests.topology import LocalCluster, command

# Not the queue's: the client's own housekeeping and this benchmark's probes.
HOUSEKEEPING = {"info", "cluster", "ping", "command", "script", "hello", "client", "flushall",
                "config", "readonly", "auth"}


def commands(cluster: LocalCluster) -> dict[int, int]:
    """Calls per master (by port), housekeeping left out."""
    counts = {}
    for node in cluster.nodes:
        stats = command(node.port, cluster.password, "INFO", "commandstats")
        counts[node.port] = sum(int(v["calls"]) for k, v in stats.items()
                                if k.removeprefix("cmdstat_").split("|")[0] not in HOUSEKEEPING)
    return counts


async def finish(done: asyncio.Event, started: float, tasks: list[asyncio.Task[Any]]) -> float:
    """Seconds from ``started`` until ``done`` (10 minutes at most); then ``tasks`` stopped."""
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.perf_counter() - started
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return elapsed


async def pipeline_run(client: Any, args: argparse.Namespace, run: str) -> float:
    """Items per second from the first ADD to the last graph COMPLETE."""
    finished = 0
    done = asyncio.Event()

    async def worker(stage: str) -> None:
        nonlocal finished
        while not done.is_set():
            leases = await queue.fetch_many(client, stage, "bench", 60_000, args.batch)
            if not leases:
                await asyncio.sleep(0.002)
                continue
            await queue.complete_many(client, leases)
            if stage == STAGES[-1]:
                finished += len(leases)
                if finished >= args.items:
                    done.set()

    async def add(i: int) -> None:
        await queue.enqueue(client, f"{run}-{i}", {"text": f"document {i}"},
                            priority=("normal", "high", "critical")[i % 3])

    started = time.perf_counter()
    workers = [asyncio.create_task(worker(stage)) for stage in STAGES
               for _ in range(args.loops)]
    await lanes(args.items, args.concurrency, add)
    elapsed = await finish(done, started, workers)
    return args.items / elapsed


def message(chat: str, n: int) -> Entry:
    return Entry(Incoming(platform="telegram", chat=chat, thread=None, user_id="u",
                          user_name="user", text=f"message {n}", message_id=str(n)),
                 {"chat_id": chat})


async def inbox_run(client: Any, args: argparse.Namespace, count: int, run: str) -> float:
    """Messages per second from the first PUSH to the last ACK (``--messages`` rounded down
    to a multiple of ``--chats``); checks that each chat's entries came in order."""
    box = Inbox(client, "telegram", shards=count)
    seen: dict[str, list[int]] = {}
    done = asyncio.Event()
    acked = 0

    async def consumer(n: int) -> None:
        nonlocal acked
        while not done.is_set():
            taken = await box.take(f"{run}-c{n}", 8)
            if not taken:
                await asyncio.sleep(0.002)
                continue
            for item in taken:
                head: str | None = item.head
                while head:
                    seen.setdefault(item.chat, []).append(
                        int(Entry.decode(head).incoming.message_id))
                    following = await box.ack(item.chat, f"{run}-c{n}", head)
                    acked += 1
                    head = following if isinstance(following, str) else None
            if acked >= args.messages // args.chats * args.chats:
                done.set()

    started = time.perf_counter()
    consumers = [asyncio.create_task(consumer(n)) for n in range(args.loops)]
    for n in range(args.messages // args.chats):  # message n of every chat, then n + 1
        async def push(i: int, n: int = n) -> None:
            await box.push(f"{run}-{i}", message(f"{run}-{i}", n), None, 3600)

        await lanes(args.chats, args.concurrency, push)
    elapsed = await finish(done, started, consumers)
    assert all(order == sorted(order) for order in seen.values()), "a chat out of order"
    return args.messages // args.chats * args.chats / elapsed


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="gwb-"))
    cluster = LocalCluster("durable", root / "cluster", embedded.new_password()).start()
    rates: dict[tuple[str, int], list[float]] = {}
    shares: dict[tuple[str, int], list[list[float]]] = {}
    try:
        client = redis_clients.connect(cluster.url, variable="bench")
        for round_ in range(args.rounds):
            for count in (1, args.shards):
                shards.configure(client, count)
                for load in ("pipeline", "inbox"):
                    await client.flushall()
                    before = commands(cluster)
                    run = f"r{round_}s{count}"
                    rate = (await pipeline_run(client, args, run) if load == "pipeline"
                            else await inbox_run(client, args, count, run))
                    after = commands(cluster)
                    calls = [after[port] - before[port] for port in sorted(after)]
                    rates.setdefault((load, count), []).append(rate)
                    shares.setdefault((load, count), []).append(
                        [c / max(1, sum(calls)) for c in calls])
        await client.aclose()
    finally:
        cluster.stop()
    print(f"items={args.items} messages={args.messages} chats={args.chats} loops={args.loops} "
          f"batch={args.batch} concurrency={args.concurrency} rounds={args.rounds} "
          "(rates: medians; shares: the highest of the rounds per master)")
    print(f"{'load':<9} {'shards':>6} {'per s':>8} {'ratio':>6}  per-master share of commands")
    worst = 0.0
    for (load, count), runs in rates.items():
        rate = statistics.median(runs)
        base = statistics.median(rates[load, 1])
        top = [max(r[i] for r in shares[load, count]) for i in range(len(cluster.nodes))]
        print(f"{load:<9} {count:>6} {rate:>8.0f} {rate / base:>6.2f}  "
              + " ".join(f"{s:.0%}" for s in top))
        if count > 1:
            worst = max(worst, *top)
    print(f"sharded: the busiest master carried {worst:.0%} of a run's commands "
          f"({'within' if worst <= 0.5 else 'OVER'} the 50 % bound)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--chats", type=int, default=300)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--loops", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=64)
    asyncio.run(main(parser.parse_args()))
