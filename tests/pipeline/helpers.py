"""Pipeline helpers for tests and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from gateway.app.worker import run_workers
from gateway.pipeline import queue
from gateway.pipeline.queue import add_call
from gateway.pipeline.scripts import scripts_for
from gateway.pipeline.worker import WorkerConfig

FAST = WorkerConfig(lease=2.0, heartbeat=0.3, reclaim_interval=0.2, backoff=0.05,
                    backoff_cap=0.2, idle_max=0.05, shutdown_grace=5)


@contextlib.asynccontextmanager
async def workers(runtime: Any, concurrency: int = 2) -> AsyncIterator[None]:
    """Every stage's workers (fast timings) running for the block; stopped and waited for
    (10 s at most) when it ends."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_workers(runtime, stop, config=FAST, concurrency=concurrency))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def queue_add(pipe: Any, item_id: str, document: dict[str, Any], *,
                    priority: str = "normal", doc_type: str = "other") -> None:
    """Queue ADD onto a ``redis.asyncio`` pipeline; its result is 1 (new) or 0 (duplicate).

    redis-py makes sure the script exists (``SCRIPT EXISTS``/``LOAD``) before the pipeline
    executes, so this survives a ``SCRIPT FLUSH`` or a restart.
    """
    keys, args = add_call(item_id, document, priority, doc_type)
    await scripts_for(pipe).add(keys=keys, args=args, client=pipe)


async def store_reclaimed(durable: Any, max_reclaims: int = 3) -> bool:
    """One RECLAIM pass over the store stage; whether it took back (or buried) anything."""
    back, dead, _ = await queue.reclaim(durable, "store", max_reclaims=max_reclaims)
    return back + dead > 0
