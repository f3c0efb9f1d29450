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

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pgvector import Vector

from gateway.knowledge.owners import EVERYTHING, Readable

log = logging.getLogger("gateway.knowledge")

_LOCK_ID = 0x766563  # "vec": index creation, one process at a time
# A build over a model's existing rows (an index dropped by hand) may take minutes.
BUILD_SECONDS = 1800.0
LOCK_POLL_SECONDS = 0.2  # another process's build: how often to try the lock again
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
    return (f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {index_name(model)} ON pipeline_chunks "
            f"USING hnsw ((embedding::vector({int(dimensions)})) vector_cosine_ops) "
            f"WHERE embedder = '{model}'")


async def ensure_index(runtime: Any, model: str, dimensions: int) -> None:
    """The model's HNSW index exists (pgvector layout only). Called before the model's first
    write in a process, on a connection of its own, and built ``CONCURRENTLY``: a plain
    build locks out every writer of chunks (the chunk and embed stages of every worker) for
    as long as it takes, minutes over a model's existing rows."""
    done = _indexed.setdefault(runtime.settings.database_url, set())
    if model in done:
        return
    if dimensions > HNSW_MAX_DIMENSIONS:
        log.warning("embedder %s: %d dimensions, more than an HNSW index takes (%d): its "
                    "searches compare every one of its vectors", model, dimensions,
                    HNSW_MAX_DIMENSIONS)
    elif (await layout(runtime)).pgvector:
        async with runtime.pg.acquire() as conn:
            # One build at a time across processes; a session lock, as a concurrent build
            # runs outside any transaction (the pool's reset unlocks it whatever happens).
            # Tried, not waited for: a statement waiting holds a snapshot, which the build
            # under the lock waits for in turn.
            await _lock(conn)
            try:
                await _build(conn, model, dimensions)
            finally:
                await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_ID)
    done.add(model)


def build_later(runtime: Any, model: str, dimensions: int) -> None:
    """``ensure_index`` in the background, for a caller inside a transaction: a concurrent
    build waits for every transaction older than it, that caller's too, so awaiting it
    there would wait forever. The model's searches compare its vectors one by one until the
    index is there. Builds are the runtime's (``shared``), cancelled when it closes."""
    if model in _indexed.get(runtime.settings.database_url, ()):
        return
    builds = runtime.shared.get(_BUILDS)
    if builds is None:
        builds = runtime.shared[_BUILDS] = IndexBuilds()
    builds.start(runtime, model, dimensions)


_BUILDS = "index_builds"


async def builds_done(runtime: Any) -> None:
    """Wait for the runtime's background index builds started so far (a test or a bench
    that then reads plans, or runs ANALYZE, which would wait on a build in turn)."""
    builds = runtime.shared.get(_BUILDS)
    if builds is not None:
        await asyncio.gather(*builds.tasks.values(), return_exceptions=True)


class IndexBuilds:
    """One process's background index builds, one per model; a failed one is started
    again by the model's next write."""

    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, runtime: Any, model: str, dimensions: int) -> None:
        if model not in self.tasks:
            self.tasks[model] = asyncio.create_task(self._run(runtime, model, dimensions))

    async def _run(self, runtime: Any, model: str, dimensions: int) -> None:
        try:
            await ensure_index(runtime, model, dimensions)
        except Exception as exc:
            log.warning("embedder %s: index not built (%s: %s); tried again later", model,
                        type(exc).__name__, exc)
            self.tasks.pop(model, None)

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


async def _lock(conn: Any) -> None:
    """The build lock, tried every ``LOCK_POLL_SECONDS`` until it is ours."""
    while True:
        if await conn.fetchval("SELECT pg_try_advisory_lock($1)", _LOCK_ID):
            return
        await asyncio.sleep(LOCK_POLL_SECONDS)


async def _build(conn: Any, model: str, dimensions: int) -> None:
    name = index_name(model)
    valid = await conn.fetchval(
        "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)", name)
    if valid:
        return
    if valid is False:  # a concurrent build that failed (or was stopped) leaves it invalid
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}", timeout=BUILD_SECONDS)
    await conn.execute(_create_index(model, dimensions), timeout=BUILD_SECONDS)


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


def walk_sql(pgvector: bool, model: str, dimensions: int, where: str, vector: str = "$1",
             limit: str = "$2", exact: bool = False) -> str:
    """The ranking alone: rows ``(item_id, seq, body, owner, d)`` of the model's chunks
    where ``where`` holds, by cosine distance ``d`` to the ``real[]`` expression ``vector``,
    nearest first, ``limit`` of them (see ``nearest_sql``)."""
    if pgvector:
        distance = (f"embedding::vector({int(dimensions)}) <=> "
                    f"{vector}::real[]::vector({int(dimensions)})")
        order = f"({distance}) + 0" if exact else distance
    else:
        distance = ("1 - (SELECT sum(a * b)"
                    f" FROM unnest(embedding, {vector}::real[]::float8[]) AS t(a, b))")
        order = f"{distance}, item_id, seq"
    return (f"SELECT item_id, seq, body, owner, {distance} AS d"
            f" FROM pipeline_chunks WHERE embedder = '{model}' AND {where}"
            f" ORDER BY {order} LIMIT {limit}")


def nearest_sql(pgvector: bool, model: str, dimensions: int,
                readable: Readable = EVERYTHING, exact: bool = False) -> tuple[str, list[Any]]:
    """``(sql, parameters after $1 and $2)``: rows ``(item_id, seq, body, owner, title, url,
    score)`` by cosine similarity to ``$1``, best first, ``$2`` of them; only the model's own
    vectors, only chunks ``readable`` allows (the condition is inside the ranked statement,
    so the ``$2`` rows are all readable ones). ``exact`` keeps the planner off the HNSW index
    (the distance ordered by is no longer the indexed expression): an exact ranking of the
    readable chunks, through the ``(embedder, owner)`` index."""
    where, params = readable.sql("owner", 3)
    # MATERIALIZED: the ranking is planned alone (the index walk), the documents' titles
    # are joined to its few rows; the outer ORDER BY also puts the rows of an iterative
    # walk (pgvector's relaxed order) back in exact order.
    walk = walk_sql(pgvector, model, dimensions, where, exact=exact)
    sql = (f"WITH found AS MATERIALIZED ({walk})"
           " SELECT f.item_id, f.seq, f.body, f.owner, doc.title, doc.url, 1 - f.d AS score"
           " FROM found f LEFT JOIN pipeline_documents doc ON doc.item_id = f.item_id"
           " ORDER BY f.d, f.item_id, f.seq")
    return sql, params


# pgvector's largest hnsw.ef_search; an older pgvector (no iterative walk) widens a filtered
# walk to it, then ranks exactly what it missed.
EF_SEARCH_MAX = 1000
ITERATIVE_VERSION = (0, 8, 0)


def _version(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in (text or "0").split("."))
    except ValueError:
        return (0,)


def walk_settings(found: Layout, limit: int, filtered: bool) -> list[str]:
    """``SET LOCAL`` statements for one HNSW walk. A walk returns at most
    ``hnsw.ef_search`` rows, and a filter drops the unreadable ones after the walk: a
    filtered walk on pgvector 0.8+ is iterative (``hnsw.iterative_scan``: it goes on until
    ``limit`` rows pass the filter or ``hnsw.max_scan_tuples`` were looked at); on an older
    one it is as wide as pgvector allows."""
    breadth = max(EF_SEARCH, limit)
    statements = []
    if filtered and _version(found.version) >= ITERATIVE_VERSION:
        statements.append("SET LOCAL hnsw.iterative_scan = relaxed_order")
    elif filtered:
        breadth = EF_SEARCH_MAX
    if breadth > EF_SEARCH:
        statements.append(f"SET LOCAL hnsw.ef_search = {int(breadth)}")
    return statements


async def fetch_walking(pool: Any, statements: list[str], sql: str, args: Sequence[Any],
                        timeout: float | None) -> list[Any]:
    """The rows of ``sql`` on one of ``pool``'s connections, after the ``SET LOCAL``
    ``statements`` of ``walk_settings`` (in a transaction of its own when there are any)."""
    if not statements:
        return list(await pool.fetch(sql, *args, timeout=timeout))
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("; ".join(statements))
        return list(await conn.fetch(sql, *args, timeout=timeout))


async def nearest(runtime: Any, vector: np.ndarray, model: str, limit: int,
                  readable: Readable, timeout: float | None = None) -> list[Any]:
    """The ``limit`` chunks nearest to ``vector`` among those ``readable`` allows (on the
    client-read pool); ``timeout`` cancels each statement. With pgvector, an HNSW walk;
    when a filtered walk found fewer than ``limit`` (the reader may read few chunks, or
    few near this query), an exact ranking of the readable chunks follows: that happens
    only when they are few, so it is cheap."""
    if readable.nothing:
        return []
    found = await layout(runtime)
    sql, params = nearest_sql(found.pgvector, model, len(vector), readable)
    args = (vector.tolist(), limit, *params)
    statements = walk_settings(found, limit, not readable.everything) if found.pgvector else []
    pool = runtime.pg_reads
    rows = await fetch_walking(pool, statements, sql, args, timeout)
    if found.pgvector and len(rows) < limit and not readable.everything:
        exact, _ = nearest_sql(True, model, len(vector), readable, exact=True)
        rows = list(await pool.fetch(exact, *args, timeout=timeout))
    return rows
