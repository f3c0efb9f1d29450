"""Request budgets with one timer for all of a route's requests instead of one each.

``asyncio.timeout`` costs a request a timer handle in the loop's heap (a push and a lazy
removal, each comparing handles in Python), a context-manager object and its two
coroutine frames: ~10 µs on the ingest path, where every inbound write has a budget. Every
request of a route has the same budget, so their deadlines fall in the order the requests
started: a FIFO of them and one timer, armed for the oldest request still running, does the
same work. When it fires it cancels the requests whose deadline has passed, drops those that
finished, and re-arms for the next one still running.

What a request sees is ``asyncio.timeout``'s behaviour: its task is cancelled at its
deadline, and ``leave`` tells the caller to answer the timeout only when that cancellation
is the one being raised (not a cancellation from elsewhere), uncancelling the task as
``asyncio.timeout`` does.
"""

from __future__ import annotations

import asyncio
from collections import deque


class _Entry:
    __slots__ = ("cancelling", "deadline", "expired", "task")

    def __init__(self, deadline: float, task: asyncio.Task[object], cancelling: int) -> None:
        self.deadline = deadline
        self.task: asyncio.Task[object] | None = task  # None once the request left
        self.cancelling = cancelling
        self.expired = False


class Deadlines:
    """The budget of ``seconds`` for each request of one route, on one event loop at a time
    (a new loop, as in tests, starts afresh)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: deque[_Entry] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def enter(self) -> _Entry:
        """The current task's budget starts now."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline needs a task")
        loop = task.get_loop()
        if loop is not self._loop:
            self._restart(loop)
        entry = _Entry(loop.time() + self.seconds, task, task.cancelling())
        self._waiting.append(entry)
        if self._timer is None:
            self._timer = loop.call_at(entry.deadline, self._expire)
        return entry

    def leave(self, entry: _Entry, cancelled: bool = False) -> bool:
        """The request is done (``cancelled``: with a ``CancelledError``). True when that
        error is this budget running out, to be answered as a timeout; as
        ``asyncio.timeout``'s exit. Leaving again does nothing."""
        task, entry.task = entry.task, None
        if task is None or not entry.expired:
            return False
        return task.uncancel() <= entry.cancelling and cancelled

    def _restart(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._loop, self._timer = loop, None
        self._waiting.clear()

    def _expire(self) -> None:
        self._timer = None
        loop, waiting = self._loop, self._waiting
        assert loop is not None
        now = loop.time()
        while waiting:
            entry = waiting[0]
            if entry.task is not None:  # still running
                if entry.deadline > now:
                    self._timer = loop.call_at(entry.deadline, self._expire)
                    return
                entry.expired = True
                entry.task.cancel()
            waiting.popleft()
