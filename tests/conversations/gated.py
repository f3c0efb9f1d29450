"""A conversation handler whose runs wait at gates the test opens:
``[conversations] handler = "tests.conversations.gated:handler"``. Run ``n`` sets
``GATES.entered[n]``, waits for ``GATES.opened[n]`` and answers ``reply <n>`` (plain text, so
nothing reaches the platform before the reply is stored). Tests set ``GATES`` fresh."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway.conversations.handlers import Context
from tests.conversations.platforms import INBOX_FAST, limits

LEASE_SECONDS = 2


@dataclass
class Gates:
    entered: defaultdict[int, asyncio.Event] = field(
        default_factory=lambda: defaultdict(asyncio.Event))
    opened: defaultdict[int, asyncio.Event] = field(
        default_factory=lambda: defaultdict(asyncio.Event))
    runs: int = 0


GATES = Gates()


@contextlib.contextmanager
def fresh() -> Iterator[Gates]:
    """New gates for the block; every gate opened at its end, so nothing is left waiting."""
    global GATES
    GATES = Gates()
    try:
        yield GATES
    finally:
        for event in GATES.opened.values():
            event.set()


async def handler(ctx: Context) -> str:
    GATES.runs += 1
    run = GATES.runs
    GATES.entered[run].set()
    await GATES.opened[run].wait()
    return f"reply {run}"


def sections(lease_seconds: float = LEASE_SECONDS) -> dict[str, Any]:
    """Test sections with this handler, generous limits and a short chat lease."""
    return {"conversations": {"handler": "tests.conversations.gated:handler"},
            "ratelimit": limits(1000), "inbox": {**INBOX_FAST, "lease_seconds": lease_seconds}}
