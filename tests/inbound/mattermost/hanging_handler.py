"""A conversation handler for the replica tests: hangs forever in a process started with
``GATEWAY_TEST_HANG=1`` (so it can be killed mid-answer), answers anywhere else."""

from __future__ import annotations

import asyncio
import os

from gateway.conversations.handlers import Context


async def handler(ctx: Context) -> str | None:
    if os.environ.get("GATEWAY_TEST_HANG") == "1":
        await asyncio.Event().wait()
    return f"answer: {ctx.incoming.text}"
