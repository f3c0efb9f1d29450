"""A hybrid search in one statement: the vector walk, the text matches and their
reciprocal-rank fusion planned and run together, on one client-read connection, in one
round trip.

Two statements one after the other cost two round trips, two plans, and every candidate's
body sent to the process (the two lists' 40 rows for the 10 it keeps); side by side they
held two of the four client-read connections per search, and the feed answered 503. Here
the server ranks both lists (``vectors.walk_sql``, ``text.matched_sql``, each as deep as
``depth``), fuses them as ``ranking.fuse`` does (a chunk's score is the sum over the lists
it is in of ``1 / (RRF_K + its rank there)``; the vector list keeps only positive
similarities; ties by item id and seq) and returns the ``limit`` best with their
documents' titles. The owner filter is inside both lists.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gateway.knowledge import text, vectors
from gateway.knowledge.owners import Readable

# $1 the query's text, $2 its vector, $3 each list's depth, $4 the answer's length, $5 the
# common words; the reader's owners from $6.
_FIRST_OWNER_PARAMETER = 6


def fused_sql(words: text.TextSettings, pgvector: bool, model: str, dimensions: int,
              readable: Readable, rrf_k: int) -> tuple[str, list[Any]]:
    """``(sql, parameters after $5)``: rows ``(item_id, seq, body, owner, title, url, score,
    similarity, matched, walked)``, best fused score first; ``walked``: the rows the vector
    walk returned (fewer than ``$3`` for a filtered walk: see ``fused``)."""
    where, params = readable.sql("owner", _FIRST_OWNER_PARAMETER)
    text_where, _ = readable.sql("c.owner", _FIRST_OWNER_PARAMETER)
    walk = vectors.walk_sql(pgvector, model, dimensions, where, "$2", "$3")
    matched = text.matched_sql(words, text_where, "$1::text", "$3", "$5::text[]",
                               all_common=False)
    # Ranks as ``ranking.fuse`` counts them: 1 for the best of each list, the vector list's
    # rows of no positive similarity left out first; ties of the fused score by item id in
    # code-point order, as Python sorts them.
    sql = (f"WITH {matched}, near AS MATERIALIZED ({walk}),"
           " lists AS (SELECT item_id, seq, body, owner,"
           " row_number() OVER (ORDER BY d, item_id, seq) AS r, 1 - d AS similarity,"
           " false AS matched FROM near WHERE 1 - d > 0"
           " UNION ALL SELECT item_id, seq, body, owner,"
           " row_number() OVER (ORDER BY rank DESC, item_id, seq), NULL, true FROM matched),"
           " fused AS MATERIALIZED (SELECT item_id, seq, min(body) AS body,"
           f" min(owner) AS owner, sum(1::float8 / ({int(rrf_k)} + r)) AS score,"
           " max(similarity) AS similarity, bool_or(matched) AS matched FROM lists"
           ' GROUP BY item_id, seq ORDER BY score DESC, item_id COLLATE "C", seq LIMIT $4)'
           " SELECT f.item_id, f.seq, f.body, f.owner, doc.title, doc.url, f.score,"
           " f.similarity, f.matched, (SELECT count(*) FROM near) AS walked"
           " FROM fused f LEFT JOIN pipeline_documents doc ON doc.item_id = f.item_id"
           ' ORDER BY f.score DESC, f.item_id COLLATE "C", f.seq')
    return sql, params


async def fused(runtime: Any, query: str, vector: np.ndarray, model: str, depth: int,
                limit: int, readable: Readable, rrf_k: int,
                timeout: float | None = None) -> list[Any] | None:
    """The fused rows of ``fused_sql`` for ``query`` and its ``vector``, or None when a
    filtered walk returned fewer than ``depth`` rows: the reader may read few chunks, and
    ``vectors.nearest`` ranks them exactly (the caller's two-statement way)."""
    found = await vectors.layout(runtime)
    sql, params = fused_sql(text.text_settings(runtime.settings), found.pgvector, model,
                            len(vector), readable, rrf_k)
    args = (query, vector.tolist(), depth, limit, await text.common_words(runtime), *params)
    statements = (vectors.walk_settings(found, depth, not readable.everything)
                  if found.pgvector else [])
    rows = await vectors.fetch_walking(runtime.pg_reads, statements, sql, args, timeout)
    walked = rows[0]["walked"] if rows else 0
    if found.pgvector and not readable.everything and walked < depth:
        return None
    return rows
