"""Cursor moves of many subscriptions share one statement (a group commit): a subscription
waits for its move to commit before it sends its next row (so a kill loses at most the row
in flight), and every move that arrived while a statement was on its way goes out with the
next one. With one subscription that is one statement per row; with a thousand delivering
at once, a handful.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg

from gateway.notifications import held as statements
from gateway.notifications.held import Held, Move


class CursorWriter:
    """Keeps one connection of ``pool`` while it has moves to write (a pooled statement
    would add the pool's reset, a second round trip, to every row)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._conn: asyncpg.Connection | None = None
        self._waiting: list[tuple[Move, asyncio.Future[bool]]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._busy = False  # a move is being written by its caller
        self.statements = 0

    async def move(self, held: Held, topic: str, offset: int, epoch: int,
                   delivered: bool) -> bool:
        """Move ``held``'s cursor on ``topic`` to ``offset``; False when its fence or version
        moved on (the position is not ours to write any more). Raises what the statement
        raised (the caller retries the row later)."""
        item: Move = (held, topic, offset, epoch, delivered)
        if self._flushing is None and not self._busy:
            return await self._alone(item)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._start()
        return await future

    async def _alone(self, item: Move) -> bool:
        """Nobody else is writing: the move is its own statement, run by its caller (no task,
        no future: the common case of one subscription delivering a backlog). Moves that
        arrive meanwhile wait for the flusher started after it."""
        self._busy = True
        try:
            self.statements += 1
            if self._conn is None:
                self._conn = await self.pool.acquire()
            try:
                moved = await statements.advance(self._conn, [item])
            except BaseException:
                await self._drop()
                raise
            return item[0].id in moved
        finally:
            self._busy = False
            self._start()

    def _start(self) -> None:
        """The flusher for what waits, unless one runs or a move is being written alone."""
        if self._waiting and self._flushing is None and not self._busy:
            self._flushing = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                # One subscription at most once per statement: a later move waits for the next.
                seen: set[str] = set()
                now: list[tuple[Move, asyncio.Future[bool]]] = []
                later: list[tuple[Move, asyncio.Future[bool]]] = []
                for item in batch:
                    (now if item[0][0].id not in seen else later).append(item)
                    seen.add(item[0][0].id)
                self._waiting = later + self._waiting
                try:
                    self.statements += 1
                    if self._conn is None:
                        self._conn = await self.pool.acquire()
                    moved = await statements.advance(self._conn, [m for m, _ in now])
                except Exception as exc:
                    await self._drop()  # broken or not: the next flush takes a fresh one
                    _settle(now, exc)
                    continue
                except BaseException:  # cancelled: nobody waits forever
                    _settle(now, None)
                    raise
                for move, future in now:
                    if not future.done():
                        future.set_result(move[0].id in moved)
        finally:
            self._flushing = None
            _settle(self._waiting, None)
            self._waiting = []

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await self.pool.release(conn)

    async def close(self) -> None:
        if self._flushing is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._flushing
        await self._drop()


def _settle(items: list[tuple[Move, asyncio.Future[bool]]], exc: Exception | None) -> None:
    """Answer the waiters that are still waiting: with ``exc``, or cancelled (None)."""
    for _, future in items:
        if future.done():
            continue
        if exc is None:
            future.cancel()
        else:
            future.set_exception(exc)
