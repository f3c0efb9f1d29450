"""Conversation service and rl: limiter throughput, each against a baseline in the same run.

Run from the repository root: ``python bench/conversations.py [--messages 1000] [--chats 50]
[--profile FILE]``. ``--profile``: cProfile over every round's inbox "arrival to answered"
run, the top functions by own and cumulative time written to FILE (FILE.prof: the raw
stats, for ``python -m pstats``).

1. Limiter: ``Limiter.check`` (the sliding-window Lua script on Redis TIME) vs a plain
   ``SET key NX EX`` (the cheapest useful Redis write), same number of calls, same 32
   coroutines. The ratio is what the exact window costs over one plain command.
2. Conversations: ``handle_incoming`` (chat lock, pointer, message + feed row, default
   handler, reply + feed row, limiter, send) over N messages spread across C chats, vs the
   floor the service cannot go below: per message, one PostgreSQL transaction inserting one
   conversation message and its feed row. Same concurrency (one coroutine per chat). Limits
   are set high so the limiter admits everything (we measure its cost, not its waiting).
3. Inbox: the chat path as the adapters run it. Per message ``Inbox.push`` (the claim and
   the entry in one script: what happens before the platform's 2xx), then the consumer
   leases the chat and (a) only stores the message and its feed row ("arrival to stored")
   or (b) runs the whole ``handle_leased`` (store, default handler, reply, limiter, send,
   settle) and acknowledges, vs the same bare baseline, measured before and after these
   two runs (their mean: load from other processes moves during a round). Also the CPU per
   message of (b) and per transaction of the baseline run after it: this process's and the
   embedded stores' (/proc), which other load moves less than the rates.
4. Round trips per message (once, after the rounds): the same workloads on a second
   Runtime whose three stores are reached through counting proxies (``bench/rtt.py``), so
   the figure is what crossed the network, not what the code claims.

Servers are embedded (redis-durable, redis-cache, PostgreSQL) on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import io
import itertools
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from rtt import RoundTripCounter  # sibling bench script
from stores import embedded_runtime, stores_cpu  # sibling bench script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway import keys
from gateway.config import Settings
from gateway.conversations.service import Incoming, handle_incoming, service_for
from gateway.inbox.component import PlatformInbox
from gateway.inbox.entry import Entry
from gateway.outbound.delivery import Send
from gateway.push import feed
from gateway.ratelimit import Limiter
from gateway.stores.runtime import Runtime, open_runtime

CONCURRENCY = 32
HIGH = {"rate": 1_000_000, "period": 1, "burst": 1_000_000}
SECTIONS = {"ratelimit": {"platforms": {"telegram": {"bot": HIGH, "chat": HIGH}}},
            "inbox": {"max_chats": 64, "poll_seconds": 0.01}}
_update_ids = itertools.count(1)


async def inbox_run(rt: Runtime, prefix: str, chats: int, per_chat: int,
                    whole: bool) -> float:
    """Messages/s through the inbox: ``chats`` producers push ``per_chat`` messages each
    while one consumer stores (or wholly handles) them; timed until the last is done."""
    service = service_for(rt)
    done, total = asyncio.Event(), chats * per_chat
    processed = 0

    async def send(text: str) -> None:
        return None

    async def process(entry: Entry, send: Send) -> None:
        nonlocal processed
        if whole:
            await service.handle_leased(entry.incoming, send)
        else:
            await service.receive_leased(entry.incoming)
        processed += 1
        if processed == total:
            done.set()

    inbox = PlatformInbox(rt, "telegram", lambda entry, retried: send, process)
    stop = asyncio.Event()
    consumer = asyncio.create_task(inbox.consumer.run(stop))

    async def producer(chat: int) -> None:
        for i in range(per_chat):
            incoming = Incoming(platform="telegram", chat=f"{prefix}{chat:04d}", thread=None,
                                user_id="u", user_name="bench", text=f"message {i}",
                                message_id=str(i))
            await inbox.push(Entry(incoming), keys.dedup_telegram_update(1, next(_update_ids)))

    started = time.perf_counter()
    await asyncio.gather(*(producer(c) for c in range(chats)))
    await done.wait()
    elapsed = time.perf_counter() - started
    stop.set()
    await consumer
    return total / elapsed


class Cpu:
    """CPU per item of a block: this process's (time.process_time) and the embedded
    stores' (/proc), which other load on the machine moves less than a rate."""

    def __init__(self, items: int) -> None:
        self.items = items
        self.parts: dict[str, float] = {}

    def __enter__(self) -> Cpu:
        self._process, self._stores = time.process_time(), stores_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        stores = stores_cpu()
        self.parts = {"process": time.process_time() - self._process,
                      **{kind: used - self._stores.get(kind, 0.0)
                         for kind, used in stores.items()}}

    @property
    def total(self) -> float:
        return sum(self.parts.values()) / self.items

    def __str__(self) -> str:
        parts = ", ".join(f"{kind} {used / self.items * 1e6:,.0f}"
                          for kind, used in self.parts.items())
        return f"{self.total * 1e6:,.0f} µs ({parts})"


def uptime() -> str:
    """The load averages, as ``uptime`` prints them: other processes share the machine."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f}, {five:.2f}, {fifteen:.2f}"


class Profiler:
    """cProfile around chosen runs (``--profile``): what the process spends per message."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.profile = cProfile.Profile() if path else None
        self.messages = 0

    @contextlib.contextmanager
    def run(self, messages: int) -> Iterator[None]:
        if self.profile is None:
            yield
            return
        self.profile.enable()
        try:
            yield
        finally:
            self.profile.disable()
            self.messages += messages

    def write(self, top: int = 30) -> None:
        if self.profile is None or not self.path or not self.messages:
            return
        out = io.StringIO()
        stats = pstats.Stats(self.profile, stream=out)
        total = stats.total_tt  # type: ignore[attr-defined]
        out.write(f"{self.messages} messages, {total / self.messages * 1e6:.0f} us of "
                  "profiled CPU per message (cProfile inflates it)\n")
        for key in ("tottime", "cumulative"):
            stats.sort_stats(key).print_stats(top)
        Path(self.path).write_text(out.getvalue())
        self.profile.dump_stats(f"{self.path}.prof")  # for pstats: callers, callees
        print(f"profile: {self.path} ({total / self.messages * 1e6:.0f} us per message "
              "under cProfile)")


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
    return service, await bare_round(rt, messages, chats, f"{round_no}")


async def bare_round(rt: Runtime, messages: int, chats: int, tag: str) -> float:
    """Bare insert+feed transactions/s: the baseline every conversation figure is set
    against (one conversation message and its feed row per transaction)."""
    per_chat = messages // chats
    conversation_id = await rt.pg.fetchval(
        "INSERT INTO conversations (platform, chat_key, chat) VALUES"
        " ('telegram', $1, 'bench') RETURNING id", f"bare-{tag}")
    seqs = itertools.count(1)

    async def bare_worker(chat: int) -> None:
        for _ in range(per_chat):
            async with rt.pg.acquire() as conn, conn.transaction():
                seq = next(seqs)
                await conn.execute(
                    "INSERT INTO conversation_messages (conversation_id, seq, role, text)"
                    " VALUES ($1, $2, 'user', 'x')", conversation_id, seq)
                await feed.append(conn, f"bench:{tag}:{chat}", "message", {"seq": seq})

    started = time.perf_counter()
    await asyncio.gather(*(bare_worker(c) for c in range(chats)))
    return per_chat * chats / (time.perf_counter() - started)


async def round_trips_per_message(settings: Settings, messages: int = 200,
                                  chats: int = 10) -> None:
    """Print network round trips per ``handle_incoming`` message and per bare insert+feed
    transaction, counted by three proxies (redis-durable, redis-cache, PostgreSQL) in front
    of a second Runtime, over ``messages`` spread across ``chats`` (one coroutine per chat,
    each chat new, as in :func:`conversation_round`). Counts are taken after every pool is
    filled and a warm-up at twice that concurrency, so connection setup and first-use
    statement preparation are excluded; a connection still opened during the measurement
    is reported."""
    urls = {"redis-durable": settings.durable_url, "redis-cache": settings.cache_url,
            "postgresql": settings.database_url}
    async with contextlib.AsyncExitStack() as stack:
        proxies: dict[str, RoundTripCounter] = {}
        for name, url in urls.items():
            parts = urlsplit(url or "")
            assert parts.hostname and parts.port, f"{name}: TCP URL needed, got {url!r}"
            proxies[name] = await stack.enter_async_context(
                RoundTripCounter(parts.hostname, parts.port))
        rt = await open_runtime(dataclasses.replace(
            settings, durable_url=proxies["redis-durable"].url_for(urls["redis-durable"] or ""),
            cache_url=proxies["redis-cache"].url_for(urls["redis-cache"] or ""),
            database_url=proxies["postgresql"].url_for(urls["postgresql"] or "")),
            pg_max_size=chats + 2)
        stack.push_async_callback(rt.close)  # closes before the proxies stop
        per_chat = messages // chats
        # Open every connection the measurement could need before counting: concurrent PINGs
        # each take a connection of their own, and the pool is filled to its maximum.
        await asyncio.gather(*(client.ping() for client in (rt.durable, rt.cache)
                               for _ in range(2 * chats)))
        held = [await rt.pg.acquire() for _ in range(chats + 2)]
        for conn in held:
            await rt.pg.release(conn)

        async def send(text: str) -> None:
            return None

        async def chat_worker(prefix: str, chat: int, count: int) -> None:
            for i in range(count):
                await handle_incoming(rt, Incoming(
                    platform="telegram", chat=f"{prefix}{chat:04d}", thread=None,
                    user_id="u", user_name="bench", text=f"message {i}", message_id=str(i)),
                    send)

        conversation_id = await rt.pg.fetchval(
            "INSERT INTO conversations (platform, chat_key, chat) VALUES"
            " ('telegram', 'bare-rtt', 'bench') RETURNING id")
        seqs = itertools.count(1)

        async def bare_worker(prefix: str, chat: int, count: int) -> None:
            for _ in range(count):
                async with rt.pg.acquire() as conn, conn.transaction():
                    seq = next(seqs)
                    await conn.execute(
                        "INSERT INTO conversation_messages (conversation_id, seq, role, text)"
                        " VALUES ($1, $2, 'user', 'x')", conversation_id, seq)
                    await feed.append(conn, f"bench:{prefix}:{chat}", "message",
                                      {"seq": seq})

        def counts() -> tuple[dict[str, int], int]:
            return ({name: p.count for name, p in proxies.items()},
                    sum(p.connections for p in proxies.values()))

        def report(label: str, before: tuple[dict[str, int], int], done: int) -> None:
            per = {name: (p.count - before[0][name]) / done for name, p in proxies.items()}
            print(f"round trips per {label}: redis-durable {per['redis-durable']:.2f}, "
                  f"redis-cache {per['redis-cache']:.2f}, postgresql {per['postgresql']:.2f}, "
                  f"total {sum(per.values()):.2f}")
            if new := sum(p.connections for p in proxies.values()) - before[1]:
                print(f"  ({new} connection(s) opened during the measurement: their setup "
                      "round trips are included)")

        for label, worker in (("message", chat_worker), ("bare insert+feed", bare_worker)):
            # Twice the measured concurrency: prepares the statements on the pooled connections.
            await asyncio.gather(*(worker("rttw", c, 3) for c in range(2 * chats)))
            before = counts()
            await asyncio.gather(*(worker("rtt", c, per_chat) for c in range(chats)))
            report(label, before, per_chat * chats)
        for label, whole in (("inbox message, arrival to stored", False),
                             ("inbox message, arrival to answered", True)):
            await inbox_run(rt, f"rttw{int(whole)}-", 2 * chats, 3, whole)
            before = counts()
            await inbox_run(rt, f"rtt{int(whole)}-", chats, per_chat, whole)
            report(label, before, per_chat * chats)


async def main_async(args: argparse.Namespace, root: Path) -> None:
    profiler = Profiler(args.profile)
    async with embedded_runtime(root, SECTIONS, pg_max_size=args.chats + 2) as rt:
        for round_no in range(1, args.rounds + 1):
            limited, plain = await limiter_round(rt, args.calls)
            print(f"round {round_no} limiter: check {limited:,.0f}/s, SET NX EX "
                  f"{plain:,.0f}/s, ratio {limited / plain:.2f}")
            service, bare = await conversation_round(rt, args.messages, args.chats,
                                                     round_no)
            print(f"round {round_no} conversations: handle_incoming {service:,.0f} msg/s,"
                  f" bare insert+feed {bare:,.0f} tx/s, ratio {service / bare:.2f}")
            per_chat = args.messages // args.chats
            stored = await inbox_run(rt, f"s{round_no}-", args.chats, per_chat, False)
            with profiler.run(per_chat * args.chats), Cpu(per_chat * args.chats) as answered:
                whole = await inbox_run(rt, f"w{round_no}-", args.chats, per_chat, True)
            # The baseline again right after, so that load from outside moving between the
            # runs shows: the inbox figures are set against the mean of the two.
            with Cpu(args.messages) as floor:
                after = await bare_round(rt, args.messages, args.chats, f"{round_no}b")
            base = (bare + after) / 2
            print(f"round {round_no} inbox: arrival to stored {stored:,.0f} msg/s (ratio "
                  f"{stored / base:.2f}), arrival to answered {whole:,.0f} msg/s (ratio "
                  f"{whole / base:.2f}) vs bare insert+feed {bare:,.0f} before and "
                  f"{after:,.0f} tx/s after ({uptime()})")
            print(f"round {round_no} CPU per message, arrival to answered: {answered}; "
                  f"per bare insert+feed (the run after): {floor}; ratio by all CPU "
                  f"{floor.total / answered.total:.2f}")
        profiler.write()
        await round_trips_per_message(rt.settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--messages", type=int, default=1_000)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", metavar="FILE",
                        help="cProfile the inbox arrival-to-answered runs; top costs to FILE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gwb-") as root:
        asyncio.run(main_async(args, Path(root)))


if __name__ == "__main__":
    main()
