"""Background work started by a webhook after it answered the platform.

Tasks start in the order they are submitted, and ``handle_incoming`` takes its per-chat lock
before anything else, so one chat's messages are handled in arrival order. ``drain`` at
shutdown lets accepted messages finish (the platform was already told "received").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("gateway.conversations")


class Background:
    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: message handling failed", self.name, exc_info=task.exception())

    async def drain(self, timeout: float) -> None:
        """Wait for running work up to ``timeout`` seconds, then cancel what is left."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("%s: %d message(s) still running at shutdown were cancelled",
                        self.name, len(pending))
            await asyncio.wait(pending, timeout=1.0)

    def __len__(self) -> int:
        return len(self._tasks)
