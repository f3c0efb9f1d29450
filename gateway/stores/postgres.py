"""The asyncpg pool; JSON and JSONB columns decode to Python objects everywhere."""

from __future__ import annotations

import json

import asyncpg


async def _init_connection(conn: asyncpg.Connection) -> None:
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(typename, encoder=json.dumps, decoder=json.loads,
                                  schema="pg_catalog")


# A statement that runs longer is cancelled by the client. Waits that may rightly be longer
# (a busy chat's lock) are taken in server-bounded slices below it.
COMMAND_TIMEOUT_SECONDS = 30.0


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10,
                      command_timeout: float = COMMAND_TIMEOUT_SECONDS) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size,
                                     init=_init_connection, command_timeout=command_timeout)
    assert pool is not None
    return pool
