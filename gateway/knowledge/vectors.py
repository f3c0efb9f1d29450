"""Where chunk vectors live and how the nearest are found.

Two layouts, told apart by the type of ``pipeline_chunks.embedding`` (migration 0010):

- **pgvector** (``vector``, no fixed dimensions): each model id gets its own partial HNSW
  index, ``USING hnsw ((embedding::vector(<dims>)) vector_cosine_ops) WHERE embedder =
  '<id>'``, created when that model first writes (its rows are then few, so the build is
  quick); the nearest are ``ORDER BY embedding::vector(<dims>) <=> query LIMIT k``, an index
  walk whose breadth is ``hnsw.ef_search`` (approximate).
- **scan** (``float8[]``, a server without the extension): a dot product per row of the
  model id's vectors (exact, linear in the number of chunks).

The model id is written into the SQL as a literal, not a parameter: the planner matches a
partial index's predicate only against constants. ``embedding.model_id`` restricts its
characters, so it cannot close the quote.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pgvector import Vector

log = logging.getLogger("gateway.knowledge")

_LOCK_ID = 0x766563  # "vec": index creation, one process at a time
# A build over a model's existing rows (an index dropped by hand) may take minutes.
BUILD_SECONDS = 1800.0
EF_SEARCH = 40  # pgvector's default breadth of an HNSW walk
HNSW_MAX_DIMENSIONS = 2000  # pgvector's limit for an HNSW index on `vector`
_LAYOUT = """
SELECT format_type(a.atttypid, a.atttypmod) AS type,
       (SELECT extversion FROM pg_extension WHERE extname = 'vector') AS version
FROM pg_attribute a
WHERE a.attrelid = 'pipeline_chunks'::regclass AND a.attname = 'embedding'
"""


@dataclass(frozen=True)
class Layout:
    pgvector: bool
    version: str | None  # the extension's version, when installed

    @property
    def column_type(self) -> str:
        return "vector" if self.pgvector else "float8[]"


# Per database URL: what a process has learnt of each database it uses.
_layouts: dict[str, Layout] = {}
_indexed: dict[str, set[str]] = {}


async def layout(runtime: Any) -> Layout:
    """The layout of the runtime's database, read once per process."""
    found = _layouts.get(runtime.settings.database_url)
    if found is None:
        row = await runtime.pg.fetchrow(_LAYOUT)
        found = Layout(row["type"] == "vector", row["version"])
        _layouts[runtime.settings.database_url] = found
    return found


def forget() -> None:
    """Read the layouts and indexes again (after a schema change under a running process)."""
    _layouts.clear()
    _indexed.clear()


def index_name(model: str) -> str:
    return "pipeline_chunks_hnsw_" + hashlib.sha256(model.encode()).hexdigest()[:16]


def _create_index(model: str, dimensions: int) -> str:
    return (f"CREATE INDEX IF NOT EXISTS {index_name(model)} ON pipeline_chunks USING hnsw "
            f"((embedding::vector({int(dimensions)})) vector_cosine_ops) "
            f"WHERE embedder = '{model}'")


async def ensure_index(runtime: Any, model: str, dimensions: int) -> None:
    """The model's HNSW index exists (pgvector layout only). Called before the model's first
    write in a process, on a connection of its own: inside a stage's transaction the build
    would hold back every other writer of chunks until that batch commits."""
    done = _indexed.setdefault(runtime.settings.database_url, set())
    if model in done:
        return
    if dimensions > HNSW_MAX_DIMENSIONS:
        log.warning("embedder %s: %d dimensions, more than an HNSW index takes (%d): its "
                    "searches compare every one of its vectors", model, dimensions,
                    HNSW_MAX_DIMENSIONS)
    elif (await layout(runtime)).pgvector:
        async with runtime.pg.acquire() as conn:
            if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL",
                                       index_name(model)):
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_ID)
                    await conn.execute(_create_index(model, dimensions),
                                       timeout=BUILD_SECONDS)
    done.add(model)


async def write(conn: Any, runtime: Any, chunks: Sequence[tuple[str, int]],
                rows: np.ndarray, model: str) -> None:
    """Store one vector per chunk ``(item_id, seq)``, recording the model that made it: one
    statement whatever the number of chunks. With pgvector the rows go as a binary
    ``vector[]``; for the scan, as one flat ``real[]`` cut by the server (a statement per
    chunk cost twice the client CPU, most of this stage's cost beside the model)."""
    items, seqs = [item for item, _ in chunks], [seq for _, seq in chunks]
    if (await layout(runtime)).pgvector:
        await conn.execute(_WRITE_VECTORS, items, seqs, [Vector(row) for row in rows], model)
    else:
        await conn.execute(_WRITE_ARRAY, items, seqs, rows.ravel().tolist(), model,
                           rows.shape[1])


_WRITE_VECTORS = """
UPDATE pipeline_chunks c SET embedding = v.e, embedder = $4
FROM unnest($1::text[], $2::int[], $3::vector[]) AS v(item_id, seq, e)
WHERE c.item_id = v.item_id AND c.seq = v.seq
"""
_WRITE_ARRAY = """
UPDATE pipeline_chunks c SET embedding = (($3::real[])[(v.i - 1) * $5 + 1 : v.i * $5])::float8[],
    embedder = $4
FROM unnest($1::text[], $2::int[]) WITH ORDINALITY AS v(item_id, seq, i)
WHERE c.item_id = v.item_id AND c.seq = v.seq
"""


def nearest_sql(pgvector: bool, model: str, dimensions: int) -> str:
    """Rows ``(item_id, body, score)`` by cosine similarity to ``$1``, best first, ``$2`` of
    them; only the model's own vectors."""
    if pgvector:
        distance = (f"embedding::vector({int(dimensions)}) <=> "
                    f"$1::real[]::vector({int(dimensions)})")
        return (f"SELECT item_id, body, 1 - ({distance}) AS score FROM pipeline_chunks "
                f"WHERE embedder = '{model}' ORDER BY {distance} LIMIT $2")
    return ("SELECT item_id, body,"
            " (SELECT sum(a * b) FROM unnest(embedding, $1::real[]::float8[]) AS t(a, b))"
            f" AS score FROM pipeline_chunks WHERE embedder = '{model}'"
            " ORDER BY score DESC, item_id, seq LIMIT $2")


async def nearest(runtime: Any, vector: np.ndarray, model: str, limit: int,
                  timeout: float | None = None) -> list[Any]:
    """The ``limit`` chunks nearest to ``vector`` (on the client-read pool); ``timeout``
    cancels the statement."""
    pgvector = (await layout(runtime)).pgvector
    sql = nearest_sql(pgvector, model, len(vector))
    if not pgvector or limit <= EF_SEARCH:
        return list(await runtime.pg_reads.fetch(sql, vector.tolist(), limit, timeout=timeout))
    # An HNSW walk returns at most ef_search rows: widen it for this statement only.
    async with runtime.pg_reads.acquire() as conn, conn.transaction():
        await conn.execute(f"SET LOCAL hnsw.ef_search = {int(limit)}")
        return list(await conn.fetch(sql, vector.tolist(), limit, timeout=timeout))
