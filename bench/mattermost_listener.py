"""Mattermost listener: posts answered per second, and reconnect latency after a drop.

Run from the repository root: ``python bench/mattermost_listener.py [--posts 400]``.
Each reconnect is measured after the connection stayed up ``HEALTHY`` seconds, so the delay
starts over from ``backoff_initial`` (drops in quick succession back off exponentially).

Baseline, in the same invocation: the same number of replies POSTed straight to the fake
server by a plain aiohttp client with the listener's concurrency (8). That is the floor (the
reply traffic itself); the ratio shows what the WebSocket read, the inbox (claim and push,
lease, the checks around the send, ack) and the bookkeeping add per post. The handler is the
placeholder echo, so no PostgreSQL is involved (the runtime's pool is not opened).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.config import Secret, Settings
from gateway.inbound.mattermost.component import MattermostBot
from gateway.stores import embedded
from gateway.stores import redis as redis_clients
from gateway.stores.runtime import Runtime
from tests.fakes.mattermost import FakeMattermost
from tests.inbound.mattermost.helpers import echo_handler

TOKEN = "bench-token"
CONCURRENCY = 8
HEALTHY = 0.5  # seconds a connection must last for the backoff to start over


async def baseline(fake: FakeMattermost, posts: int) -> float:
    """Seconds for ``posts`` direct REST replies, ``CONCURRENCY`` at a time."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    slots = asyncio.Semaphore(CONCURRENCY)
    async with aiohttp.ClientSession() as http:
        async def one(i: int) -> None:
            async with slots, http.post(f"{fake.api_url}/posts", headers=headers,
                                        json={"channel_id": "general",
                                              "message": f"echo: {i}"}) as resp:
                assert resp.status == 201

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(posts)))
        return time.perf_counter() - started


async def wait_for(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("bench condition not met")
        await asyncio.sleep(0.001)


async def main(posts: int, drops: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="gwb-"))
    servers = [embedded.RedisServer(role, root / role, embedded.new_password()).start()
               for role in ("durable", "cache")]
    durable = redis_clients.connect(servers[0].url, variable="durable")
    cache = redis_clients.connect(servers[1].url, variable="cache")
    try:
        async with FakeMattermost(token=TOKEN) as fake:
            fake.echo_own_posts = False
            floor = await baseline(fake, posts)
            fake.reset_calls()

            settings = Settings(mattermost_url=fake.url, mattermost_token=Secret(TOKEN),
                                sections={"mattermost": {
                                    "max_concurrent": CONCURRENCY, "backoff_initial": 0.5,
                                    "backoff_max": 30, "healthy_after": HEALTHY}})
            runtime = Runtime(settings, durable, cache, pg=None)  # type: ignore[arg-type]
            bot = MattermostBot(runtime, echo_handler)
            stop = asyncio.Event()
            task = asyncio.create_task(bot.run(stop))
            await fake.wait_for_sockets(1, timeout=10)
            started = time.perf_counter()
            for i in range(posts):
                await fake.create_post("general", f"p{i}")
            await wait_for(lambda: len(fake.replies()) >= posts, 120)
            answered = time.perf_counter() - started

            gaps = []
            for _ in range(drops):
                await asyncio.sleep(HEALTHY * 1.2)  # connected long enough to count as healthy
                connections = fake.ws_connections
                dropped = time.perf_counter()
                await fake.drop_sockets(1011)
                await wait_for(lambda c=connections: fake.ws_connections > c
                               and fake.open_sockets == 1, 30)
                gaps.append(time.perf_counter() - dropped)
            stop.set()
            await task
    finally:
        await durable.aclose()
        await cache.aclose()
        embedded.stop_all(servers)

    print(f"baseline: {posts} direct REST replies in {floor:.3f} s "
          f"= {posts / floor:.0f} replies/s")
    print(f"listener: {posts} posts received and answered in {answered:.3f} s "
          f"= {posts / answered:.0f} posts/s; ratio listener/baseline time "
          f"{answered / floor:.2f}x")
    print(f"reconnect after a 1011 drop of a healthy connection ({drops} drops; "
          f"backoff_initial 0.5 s, so 0.25-0.5 s with jitter): median "
          f"{statistics.median(gaps) * 1000:.0f} ms, max {max(gaps) * 1000:.0f} ms; "
          f"ratio median/0.375 s expected {statistics.median(gaps) / 0.375:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--posts", type=int, default=400)
    parser.add_argument("--drops", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.posts, args.drops))
