"""Usage rows written in batches: the rows of concurrent calls go to PostgreSQL in one
``INSERT ... SELECT FROM unnest(...)`` (one statement and round trip for the batch instead of
one per call). Each caller still waits for its own row's commit, so a call returns only once
its row is stored, as with one statement per row; a batch forms from the rows submitted while
the previous one is on the wire, so nothing waits for a timer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

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
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((row, future))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop())
        await asyncio.shield(future)

    async def _write_loop(self) -> None:
        try:
            while self._pending:
                taken, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                try:
                    self.statements += 1
                    await self.pool.execute(_INSERT, *_columns([row for row, _ in taken]))
                except BaseException as exc:
                    for _, future in taken:
                        if not future.done():
                            future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for _, future in taken:
                    if not future.done():
                        future.set_result(None)
        finally:
            self._writer = None
            for _, future in self._pending:  # cancelled at shutdown: no caller waits forever
                if not future.done():
                    future.set_exception(asyncio.CancelledError())
            self._pending = []

    async def drain(self) -> None:
        """Wait until every submitted row has been written (or failed)."""
        while self._writer is not None:
            await asyncio.shield(self._writer)


def _columns(rows: list[Row]) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)]
