"""Run the default stage handlers on one document as the workers would."""

from __future__ import annotations

from typing import Any

from gateway.knowledge.stages import chunk, embed, store
from gateway.pipeline.handlers import StageContext


async def index(runtime: Any, item_id: str, text: str) -> None:
    """Store, chunk and embed one document, each in its own transaction."""
    for handler, doc in ((store, {"text": text}), (chunk, None), (embed, None)):
        async with runtime.pg.acquire() as conn, conn.transaction():
            ctx = StageContext(item_id, handler.__name__, "normal", "other", doc, conn, runtime)
            await handler(ctx)
        for callback in ctx.after_commit:
            await callback()
