"""The default stage handlers: store persists the document, chunk splits it, embed computes
a vector per chunk, graph extracts links, mentions and tags as edges.

Each runs inside the worker's transaction (``ctx.conn``) that also writes the journal row,
so a stage's rows and its journal entry commit together or not at all. Embed's model call
comes before that transaction (``embed.prepare``), with no connection held.

What one document adds beside itself is capped, whatever its text: its first
``GATEWAY_MAX_CHUNKS_PER_DOCUMENT`` chunks (1,500; each gets a vector) and its first
``GATEWAY_MAX_EDGES_PER_DOCUMENT`` edges (1,000), in the order of the text; the rest is not
indexed, and the item completes. Links longer than ``MAX_LINK_BYTES`` are not edges.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gateway import keys
from gateway.knowledge import embedders, embedding, remote, search, text, vectors
from gateway.knowledge.text import TextSettings
from gateway.pipeline.handlers import Deferred, Handler, PermanentError, StageContext
from gateway.providers import OverBudget

log = logging.getLogger("gateway.knowledge")
T = TypeVar("T")

CHUNK_CHARS = 800
# A longer link would not fit a btree index row (about 2.7 kB with the item id): it is not
# an edge, rather than a failure that dead-letters the item.
MAX_LINK_BYTES = 2048
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_LINK = re.compile(r"https?://[^\s<>\"')\]]+")
_MENTION = re.compile(r"(?<![\w@])@([A-Za-z0-9_][A-Za-z0-9_.-]{0,63})")
_TAG = re.compile(r"(?<![\w#&])#([A-Za-z][A-Za-z0-9_-]{0,63})")


async def store(ctx: StageContext) -> None:
    """Persist the document (a new run of the item id replaces the earlier one's)."""
    await store_many([ctx])


# Store starts a run: an earlier run of the item id (accepted again after its dedup window)
# is replaced whole, its derived rows with its document. One statement for a batch: the
# cost is per statement, not per document.
_STORE = """
WITH docs AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::text[], $8::text[])
        AS t(item_id, priority, doc_type, title, url, body, document, owner)),
     chunks AS (DELETE FROM pipeline_chunks c USING docs WHERE c.item_id = docs.item_id),
     edges AS (DELETE FROM pipeline_edges e USING docs WHERE e.item_id = docs.item_id)
INSERT INTO pipeline_documents (item_id, priority, doc_type, title, url, body, document,
                                owner)
SELECT item_id, priority, doc_type, title, url, body, document::jsonb, owner FROM docs
ON CONFLICT (item_id) DO UPDATE SET priority = EXCLUDED.priority,
    doc_type = EXCLUDED.doc_type, title = EXCLUDED.title, url = EXCLUDED.url,
    body = EXCLUDED.body, document = EXCLUDED.document, owner = EXCLUDED.owner,
    stored_at = now()
"""


def _columns(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    """Rows (at least one) turned into columns: the arrays one ``unnest`` statement takes."""
    return [list(column) for column in zip(*rows, strict=True)]


async def store_many(contexts: list[StageContext]) -> None:
    """``store`` for a batch in one statement; a bad document raises, and the worker redoes
    the batch one item at a time so that only it fails."""
    rows: list[tuple[Any, ...]] = []
    for ctx in contexts:
        doc = ctx.document
        if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
            raise PermanentError("document needs a string field 'text'")
        title, url = doc.get("title"), doc.get("url")
        rows.append((ctx.item_id, ctx.priority, ctx.doc_type,
                     title if isinstance(title, str) else None,
                     url if isinstance(url, str) else None, doc["text"], json.dumps(doc),
                     keys.document_owner(ctx.item_id)))
    await contexts[0].conn.execute(_STORE, *_columns(rows))


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


async def _bodies(contexts: list[StageContext]) -> list[tuple[str, str]]:
    """The stored bodies of the contexts' documents and their owners, in their order, in
    one read; a document not stored is a permanent error (of the batch, redone one item at
    a time)."""
    rows = await contexts[0].conn.fetch(
        "SELECT item_id, body, owner FROM pipeline_documents"
        " WHERE item_id = ANY($1::text[])", [ctx.item_id for ctx in contexts])
    found = {row["item_id"]: (str(row["body"]), str(row["owner"])) for row in rows}
    if len(found) < len(contexts):
        raise PermanentError("document not stored")
    return [found[ctx.item_id] for ctx in contexts]


def _first(ctx: StageContext, found: list[T], what: str, cap: int, setting: str) -> list[T]:
    """The first ``cap`` of what a document yields, said in the log when there were more."""
    if len(found) > cap:
        log.warning("item %s: %d %s, the first %d kept (%s)", ctx.item_id, len(found), what,
                    cap, setting)
    return found[:cap]


async def chunk(ctx: StageContext) -> None:
    """Split the stored document into chunks (replacing any from an earlier run); the first
    ``max_chunks_per_document`` are kept."""
    await chunk_many([ctx])


def _chunks_insert(language: TextSettings) -> str:
    """The chunks' insert, each with its tsvector in the configured language (full-text
    search, ``gateway.knowledge.text``)."""
    return ("INSERT INTO pipeline_chunks (item_id, seq, body, owner, tsv)"
            f" SELECT t.*, {text.tsvector_sql(language, 't.body')}"
            " FROM unnest($1::text[], $2::int[], $3::text[], $4::text[])"
            " AS t(item_id, seq, body, owner)")


async def chunk_many(contexts: list[StageContext]) -> None:
    """``chunk`` for a batch: one read of the bodies, one delete, one insert."""
    rows: list[tuple[Any, ...]] = []
    for ctx, (body, owner) in zip(contexts, await _bodies(contexts), strict=True):
        kept = _first(ctx, split_text(body), "chunks",
                      ctx.runtime.settings.max_chunks_per_document,
                      "GATEWAY_MAX_CHUNKS_PER_DOCUMENT")
        rows += [(ctx.item_id, seq, part, owner) for seq, part in enumerate(kept)]
    conn = contexts[0].conn
    await conn.execute("DELETE FROM pipeline_chunks WHERE item_id = ANY($1::text[])",
                       [ctx.item_id for ctx in contexts])
    if rows:
        await conn.execute(_chunks_insert(text.text_settings(contexts[0].runtime.settings)),
                           *_columns(rows))


_CHUNKS = """
SELECT item_id, seq, body FROM pipeline_chunks WHERE item_id = ANY($1::text[])
ORDER BY item_id, seq
"""


@dataclass(frozen=True)
class Embedded:
    """An item's chunks ``(item_id, seq)`` and their vectors, found before the transaction."""

    chunks: list[tuple[str, int]]
    vectors: np.ndarray
    model: str


async def embed(ctx: StageContext) -> None:
    """A vector per chunk from the configured embedder, recorded with the model that made
    it; a spent budget delays the item. New vectors change search answers, so the search
    cache generation moves on after the commit."""
    await embed_many([ctx])


async def embed_prepare(contexts: list[StageContext]) -> None:
    """Before the batch's transaction, with no connection held (``Prepare``), for a
    provider's embedder: one read of the items' chunks on a pooled connection returned at
    once, then the embedder (a provider's call may wait minutes on 429s; a transaction must
    not wait with it); the model's index is built in the background. The local model needs
    none of it: it runs in the transaction (``embed_many``), a few ms per batch, with one
    read fewer. Each context
    gets its ``Embedded`` or, for a provider's failure, the error its item fails with."""
    runtime = contexts[0].runtime
    if isinstance(embedders.for_runtime(runtime), embedding.LocalEmbedder):
        return  # in-process and quick: read, embed and write in the transaction, one read
    rows = await runtime.pg.fetch(_CHUNKS, [c.item_id for c in contexts])
    await _embed(contexts, rows)


async def embed_many(contexts: list[StageContext]) -> None:
    """``embed`` for a batch's items at once, in the transaction (``contexts[0].conn``):
    one write of every vector ``embed_prepare`` found. Called without it (a caller running
    the handler in its own transaction), it reads and embeds here first. For the local
    model the batch is one read, one model call and one write (the stage's cost besides the
    model is per statement, not per chunk); a provider's calls stay per item, each charged
    to its item (and to the job's owner)."""
    missing = [c for c in contexts if c.prepared is None]
    if missing:
        await _embed(missing, await missing[0].conn.fetch(_CHUNKS, [c.item_id for c in missing]))
    found: list[Embedded] = []
    for ctx in contexts:
        if isinstance(ctx.prepared, BaseException):  # this item's call failed
            raise ctx.prepared
        found.append(ctx.prepared)
    runtime = contexts[0].runtime
    for model, group in itertools.groupby(
            sorted((e for e in found if e.chunks), key=lambda e: e.model),
            key=lambda e: e.model):
        done = list(group)
        await vectors.write(contexts[0].conn, runtime,
                            [chunk for e in done for chunk in e.chunks],
                            np.vstack([e.vectors for e in done]), model)
    if any(e.chunks for e in found):  # new vectors: search answers change
        for each in contexts:
            each.after_commit.append(search.invalidator(runtime.cache))


async def _embed(contexts: list[StageContext], rows: list[Any]) -> None:
    """Each context's ``Embedded`` (or its error) for its ``rows`` of ``_CHUNKS``."""
    runtime = contexts[0].runtime
    by_item: dict[str, list[Any]] = {c.item_id: [] for c in contexts}
    for row in rows:
        by_item[row["item_id"]].append(row)
    embedder = embedders.for_runtime(runtime)
    results: dict[str, np.ndarray | BaseException] = {}
    if isinstance(embedder, embedding.LocalEmbedder):  # one call for the batch's chunks
        if rows:
            every = await embedder.embed([r["body"] for r in rows])
            at = 0
            for item, found in by_item.items():
                results[item] = every[at:at + len(found)]
                at += len(found)
    else:
        for item, found in by_item.items():
            if not found:
                continue
            try:
                results[item] = await embedder.embed(
                    [r["body"] for r in found], job=item, account=keys.item_owner(item))
            except OverBudget as exc:  # it waits for the budget; it has done nothing wrong
                results[item] = Deferred(remote.budget_delay(runtime.settings), str(exc))
            except Exception as exc:  # this item fails alone; the others go on
                results[item] = exc
    for ctx in contexts:
        result = results.get(ctx.item_id)
        if isinstance(result, BaseException):
            ctx.prepared = result
            continue
        vectors_ = result if result is not None else np.zeros((0, 0), dtype=np.float32)
        model = embedding.model_id(embedder.name, vectors_.shape[1]) if len(vectors_) else ""
        if model:  # built beside this stage: the local model runs in its transaction
            vectors.build_later(runtime, model, vectors_.shape[1])
        ctx.prepared = Embedded([(r["item_id"], r["seq"]) for r in by_item[ctx.item_id]],
                                vectors_, model)


embed.many = embed_many  # type: ignore[attr-defined]
embed.prepare = embed_prepare  # type: ignore[attr-defined]


def extract_edges(text: str) -> list[tuple[str, str]]:
    """``(kind, target)`` of the text's links, @mentions and #tags, each once, in the order
    they first appear."""
    found = [(m.start(), "link", m.group().rstrip(".,;:!?")) for m in _LINK.finditer(text)]
    found += [(m.start(), "mention", m.group(1).rstrip(".-").lower())
              for m in _MENTION.finditer(text)]
    found += [(m.start(), "tag", m.group(1).lower()) for m in _TAG.finditer(text)]
    found.sort(key=lambda each: each[0])
    edges = dict.fromkeys((kind, target) for _, kind, target in found
                          if kind != "link" or len(target.encode()) <= MAX_LINK_BYTES)
    return list(edges)


async def graph(ctx: StageContext) -> None:
    """Links, @mentions and #tags of the document as edges: the first
    ``max_edges_per_document``."""
    await graph_many([ctx])


_EDGES_INSERT = """
INSERT INTO pipeline_edges (item_id, kind, target)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) ON CONFLICT DO NOTHING
"""


async def graph_many(contexts: list[StageContext]) -> None:
    """``graph`` for a batch: one read of the bodies, one insert of every edge."""
    rows: list[tuple[Any, ...]] = []
    for ctx, (body, _) in zip(contexts, await _bodies(contexts), strict=True):
        rows += [(ctx.item_id, kind, target) for kind, target in _first(
            ctx, extract_edges(body), "edges", ctx.runtime.settings.max_edges_per_document,
            "GATEWAY_MAX_EDGES_PER_DOCUMENT")]
    if rows:
        await contexts[0].conn.execute(_EDGES_INSERT, *_columns(rows))


store.many = store_many  # type: ignore[attr-defined]
chunk.many = chunk_many  # type: ignore[attr-defined]
graph.many = graph_many  # type: ignore[attr-defined]

DEFAULTS: dict[str, Handler] = {"store": store, "chunk": chunk, "embed": embed, "graph": graph}
