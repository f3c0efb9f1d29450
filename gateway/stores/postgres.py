"""The asyncpg pool; JSON and JSONB columns decode to Python objects everywhere, and
pgvector's ``vector`` to numpy arrays where the extension is installed."""

from __future__ import annotations

import json

import asyncpg
from pgvector import Vector


async def _init_connection(conn: asyncpg.Connection) -> None:
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(typename, encoder=json.dumps, decoder=json.loads,
                                  schema="pg_catalog")
    try:  # binary both ways; read as numpy arrays, like float8[] columns are read as lists
        await conn.set_type_codec(
            "vector", schema="public", format="binary",
            encoder=lambda v: (v if isinstance(v, Vector) else Vector(v)).to_binary(),
            decoder=lambda data: Vector.from_binary(data).to_numpy())
    except ValueError:  # no `vector` type here: chunk vectors are float8[] (a scan)
        pass


# A statement that runs longer is cancelled by the client. Waits that may rightly be longer
# (a busy chat's lock) are taken in server-bounded slices below it.
COMMAND_TIMEOUT_SECONDS = 30.0


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10,
                      command_timeout: float = COMMAND_TIMEOUT_SECONDS) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size,
                                     init=_init_connection, command_timeout=command_timeout)
    assert pool is not None
    return pool
