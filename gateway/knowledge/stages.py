"""The default stage handlers: store persists the document, chunk splits it, embed computes
a vector per chunk, graph extracts links, mentions and tags as edges.

Each runs inside the worker's transaction (``ctx.conn``) that also writes the journal row,
so a stage's rows and its journal entry commit together or not at all.
"""

from __future__ import annotations

import itertools
import re

import numpy as np

from gateway.knowledge import embedders, embedding, remote, search, vectors
from gateway.pipeline.handlers import Deferred, Handler, PermanentError, StageContext
from gateway.providers import OverBudget

CHUNK_CHARS = 800
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_LINK = re.compile(r"https?://[^\s<>\"')\]]+")
_MENTION = re.compile(r"(?<![\w@])@([A-Za-z0-9_][A-Za-z0-9_.-]{0,63})")
_TAG = re.compile(r"(?<![\w#&])#([A-Za-z][A-Za-z0-9_-]{0,63})")


# Store starts a run: an earlier run of the item id (accepted again after its dedup window)
# is replaced whole, its derived rows with its document, in one statement.
_STORE = """
WITH chunks AS (DELETE FROM pipeline_chunks WHERE item_id = $1),
     edges AS (DELETE FROM pipeline_edges WHERE item_id = $1)
INSERT INTO pipeline_documents (item_id, priority, doc_type, title, url, body, document)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)
ON CONFLICT (item_id) DO UPDATE SET priority = EXCLUDED.priority,
    doc_type = EXCLUDED.doc_type, title = EXCLUDED.title, url = EXCLUDED.url,
    body = EXCLUDED.body, document = EXCLUDED.document, stored_at = now()
"""


async def store(ctx: StageContext) -> None:
    """Persist the document (a new run of the item id replaces the earlier one's)."""
    doc = ctx.document
    if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
        raise PermanentError("document needs a string field 'text'")
    title, url = doc.get("title"), doc.get("url")
    await ctx.conn.execute(_STORE, ctx.item_id, ctx.priority, ctx.doc_type,
                           title if isinstance(title, str) else None,
                           url if isinstance(url, str) else None, doc["text"], doc)


def split_text(text: str, limit: int = CHUNK_CHARS) -> list[str]:
    """Paragraphs packed up to ``limit`` characters; long paragraphs split at sentences,
    then hard at ``limit``."""
    pieces: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        for sentence in _SENTENCE.split(paragraph) if len(paragraph) > limit else [paragraph]:
            pieces += [sentence[i:i + limit] for i in range(0, len(sentence), limit)]
    chunks: list[str] = []
    for piece in filter(None, pieces):
        if chunks and len(chunks[-1]) + 1 + len(piece) <= limit:
            chunks[-1] += " " + piece
        else:
            chunks.append(piece)
    return chunks


async def _body(ctx: StageContext) -> str:
    body = await ctx.conn.fetchval(
        "SELECT body FROM pipeline_documents WHERE item_id = $1", ctx.item_id)
    if body is None:
        raise PermanentError("document not stored")
    return str(body)


async def chunk(ctx: StageContext) -> None:
    """Split the stored document into chunks (replacing any from an earlier run)."""
    parts = split_text(await _body(ctx))
    await ctx.conn.execute("DELETE FROM pipeline_chunks WHERE item_id = $1", ctx.item_id)
    await ctx.conn.executemany(
        "INSERT INTO pipeline_chunks (item_id, seq, body) VALUES ($1, $2, $3)",
        [(ctx.item_id, i, part) for i, part in enumerate(parts)])


_CHUNKS = """
SELECT item_id, seq, body FROM pipeline_chunks WHERE item_id = ANY($1::text[])
ORDER BY item_id, seq
"""


async def embed(ctx: StageContext) -> None:
    """A vector per chunk from the configured embedder, recorded with the model that made
    it; a spent budget delays the item. New vectors change search answers, so the search
    cache generation moves on after the commit."""
    await embed_many([ctx])


async def embed_many(contexts: list[StageContext]) -> None:
    """``embed`` for a batch's items at once (one transaction, ``contexts[0].conn``): one
    read, one write, and for the local model one call for all their chunks (the stage's
    cost besides the model is per statement, not per chunk). A provider's calls stay per
    item, each charged to its item."""
    ctx = contexts[0]
    rows = await ctx.conn.fetch(_CHUNKS, [c.item_id for c in contexts])
    if not rows:
        return
    embedder = embedders.for_runtime(ctx.runtime)
    try:
        if isinstance(embedder, embedding.LocalEmbedder):
            found = await embedder.embed([r["body"] for r in rows])
        else:
            found = np.vstack([await embedder.embed([r["body"] for r in group], job=item)
                               for item, group in itertools.groupby(
                                   rows, key=lambda r: r["item_id"])])
    except OverBudget as exc:  # it waits for the budget; it has done nothing wrong
        raise Deferred(remote.budget_delay(ctx.runtime.settings), str(exc)) from exc
    model = embedding.model_id(embedder.name, found.shape[1])
    await vectors.ensure_index(ctx.runtime, model, found.shape[1])
    await vectors.write(ctx.conn, ctx.runtime, [(r["item_id"], r["seq"]) for r in rows],
                        found, model)
    for each in contexts:
        each.after_commit.append(search.invalidator(ctx.runtime.cache))


embed.many = embed_many  # type: ignore[attr-defined]


def extract_edges(text: str) -> set[tuple[str, str]]:
    edges = {("link", m.rstrip(".,;:!?")) for m in _LINK.findall(text)}
    edges |= {("mention", m.rstrip(".-").lower()) for m in _MENTION.findall(text)}
    edges |= {("tag", m.lower()) for m in _TAG.findall(text)}
    return edges


async def graph(ctx: StageContext) -> None:
    """Links, @mentions and #tags of the document as edges."""
    edges = extract_edges(await _body(ctx))
    await ctx.conn.executemany(
        "INSERT INTO pipeline_edges (item_id, kind, target) VALUES ($1, $2, $3)"
        " ON CONFLICT DO NOTHING", [(ctx.item_id, kind, target) for kind, target in edges])


DEFAULTS: dict[str, Handler] = {"store": store, "chunk": chunk, "embed": embed, "graph": graph}
