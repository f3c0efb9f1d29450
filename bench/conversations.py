"""Conversation service and rl: limiter throughput, each against a baseline in the same run.

Run from the repository root: ``python bench/conversations.py [--messages 1000] [--chats 50]``.

1. Limiter: ``Limiter.check`` (the sliding-window Lua script on Redis TIME) vs a plain
   ``SET key NX EX`` (the cheapest useful Redis write), same number of calls, same 32
   coroutines. The ratio is what the exact window costs over one plain command.
2. Conversations: ``handle_incoming`` (chat lock, pointer, message + feed row, default
   handler, reply + feed row, limiter, send) over N messages spread across C chats, vs the
   floor the service cannot go below: per message, one PostgreSQL transaction inserting one
   conversation message and its feed row. Same concurrency (one coroutine per chat). Limits
   are set high so the limiter admits everything (we measure its cost, not its waiting).

Servers are embedded (redis-durable, redis-cache, PostgreSQL) on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway import keys
from gateway.config import Settings
from gateway.conversations.service import Incoming, handle_incoming
from gateway.push import feed
from gateway.ratelimit import Limiter
from gateway.stores import embedded
from gateway.stores.migrate import migrate_url
from gateway.stores.runtime import Runtime, open_runtime

CONCURRENCY = 32
HIGH = {"rate": 1_000_000, "period": 1, "burst": 1_000_000}
SECTIONS = {"ratelimit": {"platforms": {"telegram": {"bot": HIGH, "chat": HIGH}}}}


async def limiter_round(rt: Runtime, calls: int) -> tuple[float, float]:
    """(limiter calls/s, SET NX EX calls/s)."""
    limiter = Limiter(rt.durable)
    counter = itertools.count()

    async def run(one: object) -> float:
        async def worker() -> None:
            while next(counter) < calls:
                await one()  # type: ignore[operator]

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return calls / (time.perf_counter() - started)

    names = itertools.cycle([f"bench:{i}" for i in range(100)])
    ids = itertools.count()
    await limiter.check("warm", rate=10, period=1)
    limited = await run(lambda: limiter.check(next(names), rate=1_000_000, period=60,
                                              burst=1_000_000))
    counter = itertools.count()
    plain = await run(lambda: rt.durable.set(keys.rl("plain", next(ids)), 1, nx=True, ex=60))
    return limited, plain


async def conversation_round(rt: Runtime, messages: int, chats: int,
                             round_no: int) -> tuple[float, float]:
    """(service messages/s, bare insert+feed transactions/s)."""
    async def send(text: str) -> None:
        return None

    per_chat = messages // chats

    async def chat_worker(chat: int) -> None:
        for i in range(per_chat):
            await handle_incoming(rt, Incoming(
                platform="telegram", chat=f"{round_no}{chat:04d}", thread=None, user_id="u",
                user_name="bench", text=f"message {i}", message_id=str(i)), send)

    started = time.perf_counter()
    await asyncio.gather(*(chat_worker(c) for c in range(chats)))
    service = per_chat * chats / (time.perf_counter() - started)

    conversation_id = await rt.pg.fetchval(
        "INSERT INTO conversations (platform, chat_key, chat) VALUES"
        " ('telegram', $1, 'bench') RETURNING id", f"bare-{round_no}")
    seqs = itertools.count(1)

    async def bare_worker(chat: int) -> None:
        for _ in range(per_chat):
            async with rt.pg.acquire() as conn, conn.transaction():
                seq = next(seqs)
                await conn.execute(
                    "INSERT INTO conversation_messages (conversation_id, seq, role, text)"
                    " VALUES ($1, $2, 'user', 'x')", conversation_id, seq)
                await feed.append(conn, f"bench:{round_no}:{chat}", "message", {"seq": seq})

    started = time.perf_counter()
    await asyncio.gather(*(bare_worker(c) for c in range(chats)))
    bare = per_chat * chats / (time.perf_counter() - started)
    return service, bare


async def main_async(args: argparse.Namespace, root: Path) -> None:
    servers: list[embedded.RedisServer | embedded.PostgresServer] = []
    try:
        durable = embedded.RedisServer("durable", root / "durable", embedded.new_password())
        cache = embedded.RedisServer("cache", root / "cache", embedded.new_password())
        pg = embedded.PostgresServer(root / "pg")
        for server in (durable, cache, pg):
            servers.append(server.start())
        await migrate_url(pg.url)
        settings = dataclasses.replace(
            Settings(durable_url=durable.url, cache_url=cache.url, database_url=pg.url),
            sections=SECTIONS)
        rt = await open_runtime(settings, pg_max_size=args.chats + 2)
        try:
            for round_no in range(1, args.rounds + 1):
                limited, plain = await limiter_round(rt, args.calls)
                print(f"round {round_no} limiter: check {limited:,.0f}/s, SET NX EX "
                      f"{plain:,.0f}/s, ratio {limited / plain:.2f}")
                service, bare = await conversation_round(rt, args.messages, args.chats,
                                                         round_no)
                print(f"round {round_no} conversations: handle_incoming {service:,.0f} msg/s,"
                      f" bare insert+feed {bare:,.0f} tx/s, ratio {service / bare:.2f}")
        finally:
            await rt.close()
    finally:
        embedded.stop_all(servers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--messages", type=int, default=1_000)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gwb-") as root:
        asyncio.run(main_async(args, Path(root)))


if __name__ == "__main__":
    main()
