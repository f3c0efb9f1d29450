"""Quota refusal benchmark: Redis time of a pipeline ADD refused because its owner is at its
quota (``[quotas]``), against an accepted ADD (the baseline) on the same instance.

An owner at its quota may keep calling (a platform retrying its deliveries while the workers
are down), so a refusal should not cost Redis much more than an acceptance. The owner holds
``--held`` items, all still in the pipeline, so every refusal samples entries and finds none
to drop (the worst case); the figure is redis-durable's own ``usec_per_call`` for EVALSHA.

    python bench/quota.py [--held 5000] [--calls 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.pipeline import queue
from gateway.pipeline.scripts import scripts_for
from gateway.stores import embedded
from gateway.stores import redis as redis_clients

REFUSED = -3


async def _usec_per_call(client: redis_clients.AnyRedis) -> float:
    stats = await client.info("commandstats")
    return float(stats["cmdstat_evalsha"]["usec_per_call"])


async def run(held: int, calls: int) -> tuple[float, float]:
    """(accepted, refused) Redis µs per ADD."""
    root = Path(tempfile.mkdtemp(prefix="bench-quota-"))
    server = embedded.RedisServer("durable", root / "durable", embedded.new_password()).start()
    client = redis_clients.connect(server.url, variable="bench")
    quota = queue.Quota("src.flood", held, 0)
    script = scripts_for(client).add
    try:
        async def add(i: int) -> int:
            keys, args = queue.add_call(f"item-{i}", {"text": "x" * 100}, quota=quota)
            return int(await script(keys=keys, args=args))

        await client.config_resetstat()
        for i in range(held):
            assert await add(i) == 1
        accepted = await _usec_per_call(client)
        await client.config_resetstat()
        for i in range(held, held + calls):
            assert await add(i) == REFUSED
        return accepted, await _usec_per_call(client)
    finally:
        await client.aclose()
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held", type=int, default=5000, help="items the owner holds")
    parser.add_argument("--calls", type=int, default=3000, help="refused ADDs measured")
    args = parser.parse_args()
    accepted, refused = asyncio.run(run(args.held, args.calls))
    print(f"owner at its quota with {args.held} items held: accepted ADD {accepted:.1f} us of "
          f"Redis, refused ADD {refused:.1f} us (x{refused / accepted:.2f} an accepted one)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
