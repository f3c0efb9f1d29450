"""Ranked chunks for a query in one of three modes, the one retrieval every reader uses
(``GET /v1/search`` and the bot's answers alike), always through the reader's owner filter.

- ``vector``: the nearest chunks by cosine similarity (``vectors.nearest``);
- ``text``: the best full-text matches (``text.matching``);
- ``hybrid`` (the default): both lists, ``CANDIDATES`` deep each, fused by reciprocal rank:
  a chunk's score is the sum over the lists it is in of ``1 / (RRF_K + its rank there)``,
  in one statement (``hybrid``; ``fuse`` here when a filtered walk found too few).
  Ranks, not scores, are fused, so cosine similarities and ``ts_rank_cd`` values need no
  common scale; a chunk both lists found comes first, and an exact word (a name, a product
  code) the embedding model does not know still brings its chunk up through the text list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.knowledge import embedders, embedding, hybrid, text, vectors
from gateway.knowledge.owners import Readable

MODES = ("vector", "text", "hybrid")
DEFAULT_MODE = "hybrid"
RRF_K = 60  # the usual constant of reciprocal-rank fusion: damps the lists' top ranks
CANDIDATES = 20  # each list's depth in a hybrid search (at least the limit)
Embedded = tuple[np.ndarray, str]  # a query's vector and its model id


@dataclass
class Hit:
    """One ranked chunk: where it is, what it says, whose document it is, its score in the
    mode asked, and what each list said of it."""

    item_id: str
    seq: int
    text: str
    owner: str
    title: str | None
    url: str | None
    score: float
    similarity: float | None = None  # cosine similarity, when the vector list had it
    matched: bool = False  # the text list had it: a word of the query is in it

    @classmethod
    def of(cls, row: Any, score: float) -> Hit:
        return cls(row["item_id"], row["seq"], row["body"], row["owner"], row["title"],
                   row["url"], score)

    def public(self) -> dict[str, Any]:
        """The entry of a search answer: title and url only when the document has them."""
        found: dict[str, Any] = {"item_id": self.item_id, "text": self.text,
                                 "score": round(self.score, 6), "owner": self.owner}
        if self.title:
            found["title"] = self.title
        if self.url:
            found["url"] = self.url
        return found


async def embed_query(runtime: Any, query: str, **usage: str | None) -> Embedded:
    """The query's vector and the model id it belongs to. Embedding the query is a call
    like any other: a provider's is limited, charged (to ``usage``: a chat, an account) and
    checked against their budgets."""
    embedder = embedders.for_runtime(runtime)
    vector = (await embedder.embed([query], purpose="search", **usage))[0]
    return vector, embedding.model_id(embedder.name, len(vector))


async def _nearest(runtime: Any, query: Embedded, limit: int, readable: Readable,
                   timeout: float | None) -> list[Hit]:
    """Vector hits with a positive similarity."""
    vector, model = query
    if not vector.any():
        return []
    hits = []
    for row in await vectors.nearest(runtime, vector, model, limit, readable, timeout):
        if row["score"] and row["score"] > 0:
            hit = Hit.of(row, float(row["score"]))
            hit.similarity = hit.score
            hits.append(hit)
    return hits


async def _matching(runtime: Any, query: str, limit: int, readable: Readable,
                    timeout: float | None, all_common: bool = True) -> list[Hit]:
    hits = []
    for row in await text.matching(runtime, query, limit, readable, timeout, all_common):
        hit = Hit.of(row, float(row["score"]))
        hit.matched = True
        hits.append(hit)
    return hits


def fuse(lists: list[list[Hit]], limit: int) -> list[Hit]:
    """Reciprocal-rank fusion of ranked lists of the same chunks (keyed by item and seq)."""
    fused: dict[tuple[str, int], Hit] = {}
    for hits in lists:
        for rank, hit in enumerate(hits, start=1):
            key = (hit.item_id, hit.seq)
            found = fused.get(key)
            if found is None:
                found = fused[key] = Hit(hit.item_id, hit.seq, hit.text, hit.owner,
                                         hit.title, hit.url, 0.0)
            found.score += 1.0 / (RRF_K + rank)
            if hit.similarity is not None:
                found.similarity = hit.similarity
            found.matched = found.matched or hit.matched
    return sorted(fused.values(), key=lambda h: (-h.score, h.item_id, h.seq))[:limit]


async def ranked(runtime: Any, query: str, limit: int, readable: Readable,
                 mode: str = DEFAULT_MODE, timeout: float | None = None,
                 embedded: Embedded | None = None) -> list[Hit]:
    """The ``limit`` best chunks for ``query`` in ``mode`` among those ``readable`` allows;
    ``timeout`` cancels each statement on the server past that many seconds; ``embedded``:
    the query's vector and model id when the caller has them already."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    if readable.nothing:
        return []
    if mode == "text":
        return await _matching(runtime, query, limit, readable, timeout)
    if embedded is None:
        embedded = await embed_query(runtime, query)
    if mode == "vector":
        return await _nearest(runtime, embedded, limit, readable, timeout)
    depth = max(limit, CANDIDATES)
    vector, model = embedded
    if vector.any():
        rows = await hybrid.fused(runtime, query, vector, model, depth, limit, readable,
                                  RRF_K, timeout)
        if rows is not None:
            return [_fused_hit(row) for row in rows]
    return await two_lists(runtime, query, embedded, limit, readable, timeout)


async def two_lists(runtime: Any, query: str, embedded: Embedded, limit: int,
                    readable: Readable, timeout: float | None = None) -> list[Hit]:
    """Hybrid's answer as two statements fused here: the way for a filtered walk that found
    too few (``vectors.nearest`` then ranks exactly) or a query of no meaning, and the
    bench's baseline for the one statement. One after the other, on one client-read
    connection at a time (side by side, two searches held all four of the read pool's
    connections and the feed got 503s). A question of common words only is ranked by
    meaning alone: its text matches are most chunks, and would cost the most to rank."""
    depth = max(limit, CANDIDATES)
    nearest = await _nearest(runtime, embedded, depth, readable, timeout)
    matching = await _matching(runtime, query, depth, readable, timeout, all_common=False)
    return fuse([nearest, matching], limit)


def _fused_hit(row: Any) -> Hit:
    hit = Hit.of(row, float(row["score"]))
    hit.similarity = None if row["similarity"] is None else float(row["similarity"])
    hit.matched = bool(row["matched"])
    return hit
