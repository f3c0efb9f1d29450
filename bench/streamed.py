"""Streamed replies: when the chat sees the first words and the whole reply, live (one
message edited as the text grows) against the baseline of the same stream collected and sent
once, in the same run.

Run from the repository root: ``python bench/streamed.py [--chats 20] [--per-chat 3]
[--deltas 30] [--every 0.05]``.

Each chat's messages go through the inbox consumer and the conversation service exactly as
an adapter's do; the handler streams ``--deltas`` pieces ``--every`` seconds apart (a model);
the platform is an in-process sender that records when each call arrived (no network, so the
figures are the gateway's: fence round trips, limiter, store, the last edit). Platform limits
are Telegram's defaults (1 message or edit per second per chat, 30 per second per bot), which
is what paces the edits. Figures: first words = first platform call minus first delta; end =
last platform call minus last delta; calls per reply; p50 and p99 over every reply.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stores import embedded_runtime, run_in_tempdir  # sibling bench script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway import keys
from gateway.conversations.handlers import Context
from gateway.conversations.service import ConversationService, Incoming
from gateway.inbox.component import PlatformInbox
from gateway.inbox.entry import Entry
from gateway.outbound.delivery import Send
from gateway.outbound.live import PlatformReply

SECTIONS = {"inbox": {"max_chats": 64, "poll_seconds": 0.01},
            "conversations": {"edit_interval": 0.05}}
_ids = itertools.count(1)


@dataclass
class Reply:
    first_delta: float = 0.0
    last_delta: float = 0.0
    calls: list[float] = field(default_factory=list)


class Recorder(PlatformReply):
    """The platform: records when each call arrived for the reply to ``message``."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply

    async def post(self, text: str, *, first: bool = True) -> str:
        self.reply.calls.append(time.perf_counter())
        return str(next(_ids))

    async def edit(self, ref: str, text: str) -> None:
        self.reply.calls.append(time.perf_counter())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(rt: Any, args: argparse.Namespace, live: bool, prefix: str) -> list[Reply]:
    replies: dict[str, Reply] = {}

    async def handler(ctx: Context) -> AsyncIterator[str]:
        reply = replies[ctx.incoming.message_id]

        async def deltas() -> AsyncIterator[str]:
            for index in range(args.deltas):
                if index == 0:
                    reply.first_delta = time.perf_counter()
                reply.last_delta = time.perf_counter()
                yield f"word{index} "
                await asyncio.sleep(args.every)

        return deltas()

    service = ConversationService(rt, handler=handler)

    def sender(entry: Entry, retried: bool) -> Send:
        reply = replies[entry.incoming.message_id]
        if live:
            return Recorder(reply)

        async def whole(text: str) -> None:
            reply.calls.append(time.perf_counter())

        return whole

    async def process(entry: Entry, send: Send) -> None:
        await service.handle_leased(entry.incoming, send)

    inbox = PlatformInbox(rt, "telegram", sender, process)
    stop = asyncio.Event()
    consumer = asyncio.create_task(inbox.consumer.run(stop))
    try:
        for n in range(args.per_chat):
            for chat in range(args.chats):
                message_id = f"{prefix}{chat}-{n}"
                replies[message_id] = Reply()
                incoming = Incoming(platform="telegram", chat=f"{prefix}{chat}", thread=None,
                                    user_id="u", user_name="u", text="hi",
                                    message_id=message_id)
                await inbox.push(Entry(incoming),
                                 keys.dedup_telegram_update(1, f"{prefix}{message_id}"))
        deadline = time.monotonic() + 60 + args.per_chat * args.deltas * args.every * 4
        while not all(r.calls and r.last_delta and r.calls[-1] > r.last_delta
                      for r in replies.values()):
            if time.monotonic() > deadline:
                raise SystemExit("replies did not all arrive in time")
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await consumer
    return list(replies.values())


def summary(replies: list[Reply]) -> dict[str, float]:
    first = [(r.calls[0] - r.first_delta) * 1000 for r in replies]
    end = [(r.calls[-1] - r.last_delta) * 1000 for r in replies]
    return {"first_p50": percentile(first, 0.5), "first_p99": percentile(first, 0.99),
            "end_p50": percentile(end, 0.5), "end_p99": percentile(end, 0.99),
            "calls": statistics.mean(len(r.calls) for r in replies)}


async def main(args: argparse.Namespace, root: Path) -> None:
    async with embedded_runtime(root, SECTIONS) as rt:
        stream_ms = args.deltas * args.every * 1000
        print(f"{args.chats} chats x {args.per_chat} replies, each {args.deltas} deltas over "
              f"{stream_ms:.0f} ms; Telegram limits (1/s per chat)")
        for round_no in (1, 2):
            live = summary(await run(rt, args, True, f"l{round_no}-"))
            whole = summary(await run(rt, args, False, f"w{round_no}-"))
            print(f"round {round_no}: first words live p50 {live['first_p50']:.1f} ms p99 "
                  f"{live['first_p99']:.1f} ms vs collected p50 {whole['first_p50']:.1f} ms "
                  f"(ratio {live['first_p50'] / whole['first_p50']:.3f}); whole reply after "
                  f"the last delta live p50 {live['end_p50']:.1f} ms p99 "
                  f"{live['end_p99']:.1f} ms vs collected p50 {whole['end_p50']:.1f} ms p99 "
                  f"{whole['end_p99']:.1f} ms; platform calls per reply live "
                  f"{live['calls']:.1f}, collected {whole['calls']:.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=20)
    parser.add_argument("--per-chat", type=int, default=3)
    parser.add_argument("--deltas", type=int, default=30)
    parser.add_argument("--every", type=float, default=0.05)
    run_in_tempdir(main, parser.parse_args())
