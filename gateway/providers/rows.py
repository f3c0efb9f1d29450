"""Usage rows written in batches: the rows of concurrent calls go to PostgreSQL in one
``INSERT ... SELECT FROM unnest(...)`` (one statement and round trip for the batch instead of
one per call). Each caller still waits for its own row's commit, so a call returns only once
its row is stored, as with one statement per row; a batch forms from the rows submitted while
the previous one is on the wire, so nothing waits for a timer. Batches that follow each other
share one pooled connection: one acquire for the run, not per statement, and each batch's
callers are answered as soon as its statement returns. A run leaves nothing in the session
(plain autocommitted INSERTs), so the pool's reset (a round trip of its own) is skipped at its
release (``GatewayConnection.leave_clean``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

from gateway.stores.postgres import leave_clean

log = logging.getLogger(__name__)

MAX_BATCH = 500  # rows per statement; more wait for the next one
Row = tuple[str, str, str, int, int, bool, str | None, str | None, str | None]

_INSERT = """
INSERT INTO provider_usage (provider, model, kind, tokens_in, tokens_out, estimated,
                            chat_key, job_id, account)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::integer[],
                     $6::boolean[], $7::text[], $8::text[], $9::text[])
"""


class RowWriter:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.statements = 0  # for tests and the bench
        self._pending: list[tuple[Row, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def write(self, row: Row) -> None:
        """Store ``row`` with the next batch; raises what the batch's statement raised."""
        await asyncio.shield(self.submit(row))

    def submit(self, row: Row) -> asyncio.Future[None]:
        """Queue ``row`` for the next batch, at once: the future is done when the row is
        stored, or holds what the batch's statement raised (``write`` waits for it)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((row, future))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop())
        return future

    async def _write_loop(self) -> None:
        taken: list[tuple[Row, asyncio.Future[None]]] = []
        try:
            while self._pending:
                taken = self._take()
                try:
                    async with self.pool.acquire() as conn:
                        while True:
                            self.statements += 1
                            await conn.execute(_INSERT, *_columns([row for row, _ in taken]))
                            _answer(taken, None)
                            if not self._pending:
                                break
                            taken = self._take()
                        leave_clean(conn)  # INSERTs leave no session state
                except BaseException as exc:  # the batch not answered yet gets the error;
                    # the next one takes a connection of its own
                    _answer(taken, exc)
                    if not isinstance(exc, Exception):
                        raise
        finally:
            self._writer = None
            for _, future in self._pending:  # cancelled at shutdown: no caller waits forever
                if not future.done():
                    future.set_exception(asyncio.CancelledError())
            self._pending = []

    def _take(self) -> list[tuple[Row, asyncio.Future[None]]]:
        taken, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
        return taken

    async def drain(self) -> None:
        """Wait until every submitted row has been written (or failed)."""
        while self._writer is not None:
            await asyncio.shield(self._writer)


def _answer(taken: list[tuple[Row, asyncio.Future[None]]], exc: BaseException | None) -> None:
    for _, future in taken:
        if future.done():
            continue
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)


def _columns(rows: list[Row]) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)]
