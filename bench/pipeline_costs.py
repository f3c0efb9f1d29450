"""Where a pipeline worker's time goes, per stage: CPU of the event loop's callbacks and
round trips (socket writes) to each store, attributed to the stage whose loop ran them.

``bench/pipeline.py --costs`` uses it in-process: each ``StageWorker`` loop runs under a
context variable naming its stage; every asyncio callback (a task step) is timed with the
thread's CPU clock and charged to the stage of its context, and every transport write is
counted against the store it goes to (by port). A feed numbering pass runs in the context of
the loop that started it, so it is charged to that stage (it also numbers the rows of the
others). Costs the loop a little (two clock reads per callback): the timed runs go without.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from gateway.pipeline.worker import StageWorker

STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("bench_stage", default="other")


class Costs:
    """CPU seconds per stage and writes per (stage, store)."""

    def __init__(self, stores: dict[int, str]) -> None:
        self.stores = stores  # port -> store name
        self.cpu: Counter[str] = Counter()
        self.writes: Counter[tuple[str, str]] = Counter()

    def table(self, items: int) -> list[str]:
        """Lines: per stage, CPU µs per item and round trips per item to each store."""
        names = sorted(set(self.stores.values()))
        lines = [f"  {'stage':8s} {'CPU us/item':>11s}  " + "  ".join(
            f"{name + ' RT/item':>16s}" for name in names)]
        for stage in sorted(self.cpu, key=_stage_order):
            lines.append(f"  {stage:8s} {1e6 * self.cpu[stage] / items:11.0f}  " + "  ".join(
                f"{self.writes[stage, name] / items:16.3f}" for name in names))
        return lines


def _stage_order(stage: str) -> int:
    from gateway.pipeline.stages import STAGES

    return STAGES.index(stage) if stage in STAGES else len(STAGES)


@contextmanager
def measured(urls: dict[str, str]) -> Iterator[Costs]:
    """Patch the event loop's callbacks, the transports' writes and the stage loops for the
    duration; ``urls``: store name -> its URL (the port tells writes apart)."""
    costs = Costs({int(urlsplit(url).port or 0): name for name, url in urls.items()})
    handle_run = asyncio.events.Handle._run
    loop_method = StageWorker._loop
    transport: Any = asyncio.selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
    write = transport.write

    def timed_run(self: Any) -> None:
        started = time.thread_time()
        try:
            handle_run(self)
        finally:
            context = getattr(self, "_context", None)
            stage = context.get(STAGE, "other") if context is not None else "other"
            costs.cpu[stage] += time.thread_time() - started

    def counted_write(self: Any, data: Any) -> None:
        peer = self.get_extra_info("peername")
        store = costs.stores.get(peer[1]) if isinstance(peer, tuple) else None
        if store is not None:
            costs.writes[STAGE.get(), store] += 1
        write(self, data)

    async def staged_loop(self: StageWorker, stop: asyncio.Event) -> None:
        STAGE.set(self.stage)
        await loop_method(self, stop)

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    transport.write = counted_write
    StageWorker._loop = staged_loop  # type: ignore[method-assign]
    try:
        yield costs
    finally:
        asyncio.events.Handle._run = handle_run  # type: ignore[method-assign]
        transport.write = write
        StageWorker._loop = loop_method  # type: ignore[method-assign]
