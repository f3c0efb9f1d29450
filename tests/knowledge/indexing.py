"""Run the default stage handlers on one document as the workers would, and lease items
waiting at the embed stage with their chunks in place."""

from __future__ import annotations

from typing import Any

from gateway.knowledge import vectors
from gateway.knowledge.stages import chunk, embed, store
from gateway.pipeline import queue
from gateway.pipeline.handlers import StageContext
from tests.pipeline.helpers import FAST


async def index(runtime: Any, item_id: str, text: str) -> None:
    """Store, chunk and embed one document, each in its own transaction."""
    for handler, doc in ((store, {"text": text}), (chunk, None), (embed, None)):
        async with runtime.pg.acquire() as conn, conn.transaction():
            ctx = StageContext(item_id, handler.__name__, "normal", "other", doc, conn, runtime)
            await handler(ctx)
        for callback in ctx.after_commit:
            await callback()


async def index_many(runtime: Any, documents: list[tuple[str, dict[str, Any]]]) -> None:
    """Store, chunk and embed ``(item_id, document)`` pairs as one batch per stage (the
    handlers' ``many``, one transaction each), as a worker's batch would."""
    for handler, many in ((store, store.many), (chunk, chunk.many),  # type: ignore[attr-defined]
                          (embed, embed.many)):  # type: ignore[attr-defined]
        async with runtime.pg.acquire() as conn, conn.transaction():
            contexts = [StageContext(item_id, handler.__name__, "normal", "other", doc, conn,
                                     runtime) for item_id, doc in documents]
            await many(contexts)
        for callback in dict.fromkeys(c for ctx in contexts for c in ctx.after_commit):
            await callback()
    await vectors.builds_done(runtime)  # the model's index, built in the background


async def leased_at_embed(runtime: Any, items: tuple[str, ...]) -> list[queue.LeasedItem]:
    """``items`` with two chunks each, enqueued at embed and leased by one FETCH."""
    await runtime.pg.copy_records_to_table(
        "pipeline_chunks", columns=["item_id", "seq", "body", "owner"],
        records=[(item, seq, f"{item} chunk {seq} about queues", "ops")
                 for item in items for seq in range(2)])
    for item in items:
        await queue.enqueue_at(runtime.durable, item, "embed", priority="normal",
                               doc_type="other")
    leases = await queue.fetch_many(runtime.durable, "embed", "w1", FAST.lease_ms, len(items))
    assert sorted(lease.item_id for lease in leases) == sorted(items)
    return leases
