"""The default stage handlers, each first keeping the CPU busy for ``BENCH_BUSY_MS``
milliseconds per item (``bench/scale.py --busy-ms``): a pipeline whose work is in the worker
process, as a handler that parses, renders or runs a model in-process makes it. With the
stores' share of the CPU small, one worker is bound by its own core, which shows whether a
second worker process adds a core's worth of items or something shared serialises them.

Loaded by the workers through ``[pipeline.handlers]`` (``bench.busy_handlers:store`` ...).
"""

from __future__ import annotations

import os
import time
from typing import Any

from gateway.knowledge.stages import DEFAULTS
from gateway.pipeline.handlers import StageContext

BUSY_SECONDS = float(os.environ.get("BENCH_BUSY_MS", "0")) / 1000


def _spin(items: int) -> None:
    """Busy (not sleeping) for ``items`` times BUSY_SECONDS of this thread's CPU time."""
    end = time.thread_time() + items * BUSY_SECONDS
    while time.thread_time() < end:
        pass


def _busy(stage: str) -> Any:
    default = DEFAULTS[stage]

    async def handler(ctx: StageContext) -> None:
        _spin(1)
        await default(ctx)

    async def many(contexts: list[StageContext]) -> None:
        _spin(len(contexts))
        await default.many(contexts)  # type: ignore[attr-defined]

    handler.many = many  # type: ignore[attr-defined]
    prepare = getattr(default, "prepare", None)
    if prepare is not None:
        handler.prepare = prepare  # type: ignore[attr-defined]
    return handler


store = _busy("store")
chunk = _busy("chunk")
embed = _busy("embed")
graph = _busy("graph")
