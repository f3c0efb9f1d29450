"""Stage handlers for the replica test's worker subprocesses (selected through
GATEWAY_CONFIG): slow enough that a worker killed mid-run still holds leases."""

from __future__ import annotations

import asyncio

from gateway.knowledge.stages import chunk
from gateway.pipeline.handlers import StageContext

CHUNK_DELAY = 0.05


async def slow_chunk(ctx: StageContext) -> None:
    """The default chunk handler after a short pause (a batch holds its leases meanwhile)."""
    await asyncio.sleep(CHUNK_DELAY)
    await chunk(ctx)
