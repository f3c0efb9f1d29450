"""Cluster client benchmark: the cost of running the same Redis work on a local
three-master cluster instead of one instance, and of the gateway's cluster client
(``gateway.stores.cluster.GatewayCluster``) over redis-py's bare ``RedisCluster``.

Workload per run: ``--ops`` dedup claims (``SET NX EX``) with ``--concurrency`` in flight, then
the same number of token-checked releases (a Lua script by SHA, one key each), on keys that
hash across every primary. Three clients, interleaved ``--rounds`` times:

* single: ``redis_clients.connect`` on one durable instance (the baseline);
* gateway cluster: ``redis_clients.connect`` on a durable cluster (GatewayCluster);
* bare cluster: ``redis.asyncio.cluster.RedisCluster`` on the same cluster.

    python bench/cluster.py [--ops 20000] [--concurrency 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from redis.asyncio.cluster import RedisCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway import keys
from gateway.dedup import claims
from gateway.stores import embedded
from gateway.stores import redis as redis_clients
from tests.topology import LocalCluster


async def lanes(count: int, concurrency: int, job: Callable[[int], Awaitable[Any]]) -> None:
    """``job(0..count-1)``, at most ``concurrency`` at a time."""
    next_index = 0

    async def lane() -> None:
        nonlocal next_index
        while next_index < count:
            index = next_index
            next_index += 1
            await job(index)

    await asyncio.gather(*(lane() for _ in range(concurrency)))


async def one_run(client: Any, ops: int, concurrency: int, tag: str) -> tuple[float, float]:
    """(claims/s, releases/s) on ``client``; keys are fresh per run."""
    await client.ping()
    made: list[claims.Claim | None] = [None] * ops

    async def claim(i: int) -> None:
        made[i] = await claims.claim(client, keys.dedup_job(f"{tag}-{i}"), 60)

    async def release(i: int) -> None:
        found = made[i]
        assert found is not None and found.claimed
        assert await claims.release(client, found)

    start = time.perf_counter()
    await lanes(ops, concurrency, claim)
    middle = time.perf_counter()
    await lanes(ops, concurrency, release)
    end = time.perf_counter()
    return ops / (middle - start), ops / (end - middle)


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="gwb-"))
    single = embedded.RedisServer("durable", root / "single", embedded.new_password()).start()
    cluster = LocalCluster("durable", root / "cluster", embedded.new_password()).start()
    try:
        clients = {
            "single": redis_clients.connect(single.url, variable="bench"),
            "gateway cluster": redis_clients.connect(cluster.url, variable="bench"),
            "bare cluster": RedisCluster.from_url(cluster.url.replace("+cluster", "", 1),
                                                  decode_responses=True, protocol=2),
        }
        await clients["bare cluster"].initialize()  # its first-command race, see redis_cluster
        for name, client in clients.items():  # fill each pool before anything is timed
            await one_run(client, max(args.ops // 10, args.concurrency), args.concurrency,
                          f"warm-{name.replace(' ', '-')}")
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
        for round_ in range(args.rounds):
            for name, client in clients.items():
                tag = f"{name.replace(' ', '-')}-{round_}"
                results[name].append(await one_run(client, args.ops, args.concurrency, tag))
        for client in clients.values():
            await client.aclose()
    finally:
        cluster.stop()
        single.stop()

    base_claim = statistics.median(r[0] for r in results["single"])
    base_release = statistics.median(r[1] for r in results["single"])
    bare_claim = statistics.median(r[0] for r in results["bare cluster"])
    print(f"ops={args.ops} concurrency={args.concurrency} rounds={args.rounds} "
          "(medians; ratios to single)")
    print(f"{'client':<16} {'claims/s':>10} {'ratio':>6} {'releases/s':>11} {'ratio':>6}")
    for name, runs in results.items():
        claim_rate = statistics.median(r[0] for r in runs)
        release_rate = statistics.median(r[1] for r in runs)
        print(f"{name:<16} {claim_rate:>10.0f} {claim_rate / base_claim:>6.2f} "
              f"{release_rate:>11.0f} {release_rate / base_release:>6.2f}")
    gateway_claim = statistics.median(r[0] for r in results["gateway cluster"])
    print(f"gateway cluster / bare cluster, claims: {gateway_claim / bare_claim:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
