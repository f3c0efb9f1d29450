"""A conversation handler that answers with a scripted stream of text deltas, as a model
would: ``[conversations] handler = "tests.conversations.scripted:handler"``. Tests set
``SCRIPT`` before the message arrives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gateway.conversations.handlers import Context


class ScriptedFailure(RuntimeError):
    """What a failing script raises (a provider dying mid-stream)."""


@dataclass
class Script:
    deltas: list[str] = field(default_factory=lambda: [f"w{i} " for i in range(20)])
    first_after: float = 0.0  # seconds before the first delta (the typing indicator shows)
    every: float = 0.05  # seconds between deltas
    fail_after: int | None = None  # raise after this many deltas
    stall_after: int | None = None  # the first run stops after this many deltas, forever
    runs: int = 0  # handler calls so far
    stalled: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def text(self) -> str:
        return "".join(self.deltas)


SCRIPT = Script()


async def _stream(script: Script, run: int) -> AsyncIterator[str]:
    await asyncio.sleep(script.first_after)
    for index, delta in enumerate(script.deltas):
        if script.fail_after is not None and index == script.fail_after:
            raise ScriptedFailure("the model went away")
        if run == 1 and script.stall_after is not None and index == script.stall_after:
            script.stalled.set()
            await asyncio.Event().wait()
        yield delta
        await asyncio.sleep(script.every)
    if script.fail_after is not None and script.fail_after >= len(script.deltas):
        raise ScriptedFailure("the model went away")


async def handler(ctx: Context) -> AsyncIterator[str]:
    SCRIPT.runs += 1
    return _stream(SCRIPT, SCRIPT.runs)
