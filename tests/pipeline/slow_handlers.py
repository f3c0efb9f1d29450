"""Handlers for worker subprocesses in fault tests (selected through GATEWAY_CONFIG)."""

from __future__ import annotations

import asyncio

from gateway.knowledge.stages import store
from gateway.pipeline.handlers import StageContext


async def store_then_hang(ctx: StageContext) -> None:
    """Persist like the default, then never finish: the test kills the process meanwhile."""
    await store(ctx)
    await asyncio.sleep(3600)


async def chunk_forever(ctx: StageContext) -> None:
    """Never finishes: SIGTERM must release the item after the grace period."""
    await asyncio.sleep(3600)
