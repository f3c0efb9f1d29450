"""Pipeline helpers for tests and benchmarks."""

from __future__ import annotations

from typing import Any

from gateway.pipeline import queue
from gateway.pipeline.queue import add_call
from gateway.pipeline.scripts import scripts_for


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
