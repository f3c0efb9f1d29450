"""Model provider calls: what the chain adds to a call, and what a budget check costs.

Run from the repository root: ``python bench/providers.py [--calls 2000] [--rows 10000,100000]``.

1. Chain overhead: ``Chain.embeddings`` (budget check with all three budgets set, the
   provider's ``rl:`` slot and request+tokens windows, the call, the tokens settled, the
   usage row) vs the bare ``OpenAIClient.embeddings`` (the same HTTP call alone), both
   against the fake OpenAI-compatible server on loopback (``tests/fakes/openai.py``), same
   16 coroutines, limits set high so nothing waits. The ratio is calls/s chain / bare. The
   two run in turn, ``--slices`` slices of each (10: 200 calls a slice), so that load from
   other processes, which moves within seconds on a shared machine, falls on both alike.
2. Budget check: ``UsageLedger.check`` (one statement, three index-only sums over today's
   rows) at N usage rows today (spread over 1,000 chats and 100 accounts), p50/p99, vs
   ``SELECT 1`` on the same pool (the floor of any statement).

Servers are embedded (redis-durable, redis-cache, PostgreSQL) on this machine.
``--parts``: also the chain's parts without the HTTP call (the limiter alone, the ledger
alone), CPU per call. ``--profile FILE``: the chain's calls of each round under cProfile
(stats to FILE, the top costs per call printed), the bare client's runs unprofiled.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import os
import pstats
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stores import embedded_runtime, run_in_tempdir  # sibling bench script

from gateway.providers import Charge, ModelProviders, Usage, UsageLedger, budgets
from gateway.stores.runtime import Runtime
from tests.fakes.openai import FakeOpenAI, provider_tables

CONCURRENCY = 16
KEY = "sk-bench"
BUDGETS = {"daily_tokens_per_chat": 10**12, "daily_tokens_per_account": 10**12,
           "daily_tokens": 10**12}


@dataclasses.dataclass
class Rate:
    per_second: float
    cpu_us: float  # this process's CPU per call (the fake server's included, stores' not)
    calls: int = 0
    seconds: float = 0.0

    def plus(self, other: Rate) -> Rate:
        """Two runs as one: their calls over their summed time and CPU."""
        calls, seconds = self.calls + other.calls, self.seconds + other.seconds
        cpu = self.cpu_us * self.calls + other.cpu_us * other.calls
        return Rate(calls / seconds, cpu / calls, calls, seconds)


async def rate(calls: int, one: Callable[[int], Awaitable[object]]) -> Rate:
    """Calls/s of ``one(i)`` for i in range(calls), from CONCURRENCY coroutines, and the CPU
    time per call, which other work on the machine hardly moves (unlike calls/s)."""
    counter = iter(range(calls))

    async def worker() -> None:
        for i in counter:
            await one(i)

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    seconds = time.perf_counter() - started
    return Rate(calls / seconds, (time.process_time() - cpu) / calls * 1e6, calls, seconds)


def bench_providers(rt: Runtime, fake: FakeOpenAI) -> ModelProviders:
    """The provider "bench" on the fake, limits set high so nothing waits, every budget."""
    tables = provider_tables(("bench", fake), key_env="BENCH_KEY",
                             requests_per_minute=10**7, tokens_per_minute=10**9,
                             concurrent=CONCURRENCY)
    settings = dataclasses.replace(rt.settings, sections={"providers": tables,
                                                          "budgets": BUDGETS})
    return ModelProviders.from_settings(settings, rt.durable, rt.pg,
                                        environ={"BENCH_KEY": KEY})


async def chain_round(rt: Runtime, fake: FakeOpenAI, calls: int, slices: int,
                      profile: cProfile.Profile | None = None) -> tuple[Rate, Rate]:
    providers = bench_providers(rt, fake)
    try:
        chain, client = providers.chain(["bench"]), providers.client("bench")
        texts = ["a short chunk of text to embed"] * 4
        await rate(50, lambda i: client.embeddings("m", texts))  # warm-up
        bare, full = Rate(0.0, 0.0), Rate(0.0, 0.0)
        for start in range(0, calls, calls // slices):  # alternately, slice by slice
            n = min(calls // slices, calls - start)
            bare = bare.plus(await rate(n, lambda i: client.embeddings("m", texts)))
            if profile is not None:
                profile.enable()
            full = full.plus(await rate(n, lambda i: chain.embeddings(
                "m", texts, charge=Charge(chat=f"c{i % 50}", account=f"a{i % 5}"))))
            if profile is not None:
                profile.disable()
    finally:
        await providers.close()
    return full, bare


async def parts_round(rt: Runtime, fake: FakeOpenAI, calls: int) -> tuple[Rate, Rate]:
    """What the chain adds, in two parts without the HTTP call, each from CONCURRENCY
    coroutines: the limiter alone (the slot, request and tokens taken, the tokens settled and
    the slot given back, not waited for, as the chain does: two script calls) and the ledger
    alone (the budget check, the usage row)."""
    providers = bench_providers(rt, fake)
    limits, ledger = providers.limits, providers.ledger
    assert ledger is not None

    async def limited(i: int) -> None:  # as the chain does: the release not waited for
        ticket = await limits.admit("bench", tokens=32)
        await ticket.settle(30)
        ticket.finish_nowait()

    async def ledgered(i: int) -> None:
        charge = Charge(chat=f"c{i % 50}", account=f"a{i % 5}")
        await ledger.check(charge)
        await ledger.record(provider="bench", model="m", kind="embeddings", usage=Usage(30),
                            charge=charge)

    try:
        await limited(-1)
        return await rate(calls, limited), await rate(calls, ledgered)
    finally:
        await providers.close()


async def check_round(rt: Runtime, rows: int, samples: int = 500) -> tuple[float, ...]:
    await rt.pg.execute("TRUNCATE provider_usage")
    await rt.pg.execute(
        "INSERT INTO provider_usage (provider, model, kind, tokens_in, tokens_out, chat_key,"
        " account, created_at) SELECT 'p', 'm', 'chat', 100, 20, 'chat-' || (i % 1000),"
        " 'acct-' || (i % 100), now() - make_interval(secs => (i % 3600))"
        " FROM generate_series(1, $1) AS i", rows)
    await rt.pg.execute("VACUUM ANALYZE provider_usage")
    ledger = UsageLedger(rt.pg, budgets(dataclasses.replace(
        rt.settings, sections={"budgets": BUDGETS})))

    async def timed(one: Callable[[int], Awaitable[object]]) -> list[float]:
        out = []
        for i in range(samples):
            started = time.perf_counter()
            await one(i)
            out.append((time.perf_counter() - started) * 1e6)
        return sorted(out)

    check = await timed(lambda i: ledger.check(Charge(chat=f"chat-{i % 1000}",
                                                       account=f"acct-{i % 100}")))
    floor = await timed(lambda i: rt.pg.fetchval("SELECT 1"))
    p99 = int(samples * 0.99)
    return (statistics.median(check), check[p99], statistics.median(floor), floor[p99])


def print_profile(profile: cProfile.Profile, path: str, calls: int, top: int = 25) -> None:
    """The functions with the most time inside them (callees included) per chain call."""
    profile.dump_stats(path)
    stats = pstats.Stats(profile)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][3])  # type: ignore[attr-defined]
    print(f"profile of {calls:,} chain calls (cumulative µs per call):")
    for (filename, line, name), (_, _, _, cumulative, _) in rows[:top]:
        where = filename.rsplit("site-packages/", 1)[-1].rsplit("/work/", 1)[-1]
        print(f"  {cumulative / calls * 1e6:8.0f}  {name} ({where}:{line})")


async def main_async(args: argparse.Namespace, root: Path) -> None:
    print(f"load at start: {os.getloadavg()[0]:.2f}")
    profile = cProfile.Profile() if args.profile else None
    async with embedded_runtime(root, pg_max_size=CONCURRENCY + 2) as rt:
        async with FakeOpenAI(api_key=KEY) as fake:
            for round_no in range(1, args.rounds + 1):
                full, bare = await chain_round(rt, fake, args.calls, args.slices, profile)
                print(f"round {round_no} chain: {full.per_second:,.0f} calls/s "
                      f"({full.cpu_us:,.0f} µs CPU/call), bare client "
                      f"{bare.per_second:,.0f} calls/s ({bare.cpu_us:,.0f} µs CPU/call), "
                      f"ratio {full.per_second / bare.per_second:.2f} by calls/s, "
                      f"{bare.cpu_us / full.cpu_us:.2f} by CPU per call "
                      f"(load {os.getloadavg()[0]:.1f})")
                fake.reset()
                if args.parts:
                    limiter, ledger = await parts_round(rt, fake, args.calls)
                    print(f"round {round_no} parts: limiter alone {limiter.cpu_us:,.0f} µs "
                          f"CPU/call, ledger alone {ledger.cpu_us:,.0f} µs CPU/call "
                          f"(load {os.getloadavg()[0]:.1f})")
        if profile is not None:
            print_profile(profile, args.profile, args.calls * args.rounds)
        for round_no in range(1, args.rounds + 1):
            for rows in args.rows:
                c50, c99, f50, f99 = await check_round(rt, rows)
                print(f"round {round_no} budget check at {rows:,} rows today: p50 "
                      f"{c50:,.0f} µs p99 {c99:,.0f} µs; SELECT 1 p50 {f50:,.0f} µs "
                      f"p99 {f99:,.0f} µs; p50 ratio {c50 / f50:.1f}")
    print(f"load: {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--rows", type=lambda v: [int(x) for x in v.split(",")],
                        default=[10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--slices", type=int, default=10,
                        help="each side's calls in this many slices, bare and chain in turn")
    parser.add_argument("--parts", action="store_true",
                        help="also the limiter alone and the ledger alone, CPU per call")
    parser.add_argument("--profile", metavar="FILE",
                        help="cProfile the chain's calls; stats to FILE, top costs printed")
    run_in_tempdir(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
