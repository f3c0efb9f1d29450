"""A conversation handler whose runs wait at gates the test opens:
``[conversations] handler = "tests.conversations.gated:handler"``. Run ``n`` sets
``GATES.entered[n]``, waits for ``GATES.opened[n]`` and answers ``reply <n>`` (plain text, so
nothing reaches the platform before the reply is stored). Tests set ``GATES`` fresh."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field

from gateway.conversations.handlers import Context


@dataclass
class Gates:
    entered: defaultdict[int, asyncio.Event] = field(
        default_factory=lambda: defaultdict(asyncio.Event))
    opened: defaultdict[int, asyncio.Event] = field(
        default_factory=lambda: defaultdict(asyncio.Event))
    runs: int = 0


GATES = Gates()


async def handler(ctx: Context) -> str:
    GATES.runs += 1
    run = GATES.runs
    GATES.entered[run].set()
    await GATES.opened[run].wait()
    return f"reply {run}"
