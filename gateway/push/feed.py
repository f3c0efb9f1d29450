"""The durable feed: append rows inside the writer's transaction, signal them
after the commit, read them back by offset.

Two ways to append. ``append``/``append_many`` allocate the offset in the writer's
transaction from a per-topic counter row (``feed_topics``) that stays row-locked until the
caller commits, so commit order is offset order; a second writer of the topic waits, which
suits topics written one writer at a time (a conversation, already serialised on its own
row). ``append_pending`` writes the rows without offsets and locks nothing shared; after the
commit, ``gateway.push.sequencer`` numbers every committed pending row of the topic in one
short transaction (``feed_number``, migration 0011) and signals them: the way for a topic
that many writers share (``pipeline``). A pass of a topic numbers its family with it (the
topics ``<topic>:...``: the pipeline's ``pipeline:<owner>`` rows ride on the pass of
``pipeline``, migration 0018). Either way a poller reading ``offset > N`` never
sees N+2 before N+1.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from gateway.push.channel import (
    INLINE_ROW_MAX_CHARS,
    Signal,
    publish_bodies_soon,
    publish_signals,
    signal_bodies,
)
from gateway.push.protocol import FeedError, FeedRow, check_offset, check_topic
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.redis import AnyRedis

MAX_READ_LIMIT = 1000
KIND_MAX = 100


@dataclass(frozen=True)
class FeedPage:
    """One read: the topic's epoch, how far retention trimmed it, its head, and rows."""

    topic: str
    epoch: int
    trimmed_through: int
    last_offset: int
    rows: list[FeedRow]


_APPEND = """
WITH counter AS (
    INSERT INTO feed_topics AS t (topic, last_offset) VALUES ($1, 1)
    ON CONFLICT (topic) DO UPDATE SET last_offset = t.last_offset + 1
    RETURNING t.topic, t.last_offset, t.epoch
)
INSERT INTO feed (topic, "offset", epoch, kind, payload)
SELECT topic, last_offset, epoch, $2, $3::jsonb FROM counter
RETURNING "offset", epoch, created_at
"""


async def append(conn: asyncpg.Connection, topic: str, kind: str,
                 payload: dict[str, Any]) -> FeedRow:
    """Append one row in the caller's open transaction; offset = last + 1 for the topic.

    Publish the returned row with :func:`publish` only after that transaction commits.
    """
    check_topic(topic)
    check_row(kind, payload)
    record = await conn.fetchrow(_APPEND, topic, kind, payload)
    assert record is not None
    return FeedRow(topic, record["offset"], record["epoch"], kind, payload, record["created_at"])


def check_row(kind: str, payload: Any) -> None:
    if not isinstance(kind, str) or not kind or len(kind) > KIND_MAX or not kind.isprintable():
        # The kind becomes an SSE "event:" line: no line breaks or control characters.
        raise FeedError(f"kind must be 1-{KIND_MAX} printable characters")
    if not isinstance(payload, dict):
        raise FeedError("payload must be a JSON object")


# One counter update reserves the block (last+1 .. last+n) under the topic's row lock; the
# rows take their offsets from their position in the arrays.
_APPEND_MANY = """
WITH counter AS (
    INSERT INTO feed_topics AS t (topic, last_offset) VALUES ($1, $2)
    ON CONFLICT (topic) DO UPDATE SET last_offset = t.last_offset + $2
    RETURNING t.last_offset - $2 AS base, t.epoch
)
INSERT INTO feed (topic, "offset", epoch, kind, payload)
SELECT $1, counter.base + r.ord, counter.epoch, r.kind, r.payload::jsonb
FROM counter, unnest($3::text[], $4::text[]) WITH ORDINALITY AS r(kind, payload, ord)
RETURNING "offset", epoch, created_at
"""


async def append_many(conn: asyncpg.Connection, topic: str,
                      rows: list[tuple[str, dict[str, Any]]]) -> list[FeedRow]:
    """Append ``rows`` (kind, payload) in the caller's open transaction with one statement:
    one counter update allocates consecutive offsets, in the order given.

    Same guarantees as :func:`append` (the block is allocated in this transaction, which
    holds the topic's counter row until it commits); one round trip instead of ``len(rows)``
    is what keeps a group commit's locked section short.
    """
    check_topic(topic)
    if not rows:
        return []
    for kind, payload in rows:
        check_row(kind, payload)
    records = await conn.fetch(
        _APPEND_MANY, topic, len(rows), [kind for kind, _ in rows],
        [_compact(payload) for _, payload in rows])
    records = sorted(records, key=lambda r: r["offset"])
    assert len(records) == len(rows)
    return [FeedRow(topic, r["offset"], r["epoch"], kind, payload, r["created_at"])
            for r, (kind, payload) in zip(records, rows, strict=True)]


_APPEND_PENDING = """
INSERT INTO feed_pending (topic, kind, payload)
SELECT r.topic, r.kind, r.payload::jsonb
FROM unnest($1::text[], $2::text[], $3::text[]) AS r(topic, kind, payload)
"""


async def append_pending(conn: asyncpg.Connection, topic: str,
                         rows: list[tuple[str, dict[str, Any]]]) -> int:
    """Append ``rows`` (kind, payload) in the caller's open transaction *without* offsets:
    nothing shared is locked, so writers of a busy topic commit side by side. After the
    commit, :meth:`gateway.push.sequencer.Sequencer.sequence` numbers them (in the order
    given, other writers' rows perhaps in between) and signals them; returns how many rows
    were written."""
    await append_pending_rows(conn, [(topic, kind, payload) for kind, payload in rows])
    return len(rows)


async def append_pending_rows(conn: asyncpg.Connection,
                              rows: list[tuple[str, str, dict[str, Any]]]) -> set[str]:
    """``append_pending`` for rows of several topics, ``(topic, kind, payload)`` each, in
    one statement; returns the topics written (each needs its ``sequence`` call)."""
    for topic, kind, payload in rows:
        check_topic(topic)
        check_row(kind, payload)
    if not rows:
        return set()
    await conn.execute(_APPEND_PENDING, [topic for topic, _, _ in rows],
                       [kind for _, kind, _ in rows],
                       [_compact(payload) for _, _, payload in rows])
    return {topic for topic, _, _ in rows}


def _compact(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"))


# A numbering statement (``feed_number_family``, migration 0018) returning its rows in
# (topic, offset) order with their payloads as text, and for each row a pass signals (each of
# the topic's own, and the last of each other topic of its family) the signal's JSON, built
# here by PostgreSQL as ``channel.signal_body`` builds it: the head, then the row's wire form
# (``FeedRow.to_json``, ``created_at`` as Python's ``isoformat`` writes it) as ``"row"`` when
# it is at most $3 characters. So a pass that nobody reads the rows of decodes none and
# encodes none again. (JSON text of PostgreSQL: the payload's whitespace and escapes differ
# from Python's, the values do not.)
_NUMBER = """
WITH n AS (
    SELECT feed_topic AS topic, feed_offset AS "offset", feed_epoch AS epoch,
           feed_kind AS kind, feed_payload::text AS payload, feed_created_at AS created_at,
           feed_topic = $1
           OR feed_offset = max(feed_offset) OVER (PARTITION BY feed_topic) AS signalled
    FROM feed_number_family($1, $2)
), parts AS (
    SELECT n.*, to_json(n.topic)::text AS t, to_json(n.kind)::text AS k,
           to_char(n.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
           || coalesce(nullif(to_char(n.created_at AT TIME ZONE 'UTC', '.US'), '.000000'), '')
           || '+00:00' AS at
    FROM n
), wire AS (
    SELECT parts.*, '{"topic":' || t || ',"offset":' || "offset" || ',"epoch":' || epoch
           || ',"kind":' || k || ',"payload":' || payload || ',"created_at":"' || at
           || '"}' AS row_wire
    FROM parts
)
SELECT topic, "offset", epoch, kind, payload, created_at,
       CASE WHEN signalled THEN
           '{"topic":' || t || ',"offset":' || "offset" || ',"kind":' || k || ',"epoch":'
           || epoch || CASE WHEN length(row_wire) <= $3 THEN ',"row":' || row_wire ELSE ''
           END || '}'
       END AS signal
FROM wire ORDER BY topic, "offset"
"""


@dataclass(frozen=True)
class Numbered:
    """The rows one numbering statement made, in (topic, offset) order, as PostgreSQL
    returned them: decoded into ``FeedRow``s only when someone reads them (``rows``), while
    their signals go out as PostgreSQL wrote them (``signals``)."""

    topic: str  # the topic numbered (with its family)
    records: list[asyncpg.Record]

    def __len__(self) -> int:
        return len(self.records)

    def rows(self) -> list[FeedRow]:
        return [FeedRow(r["topic"], r["offset"], r["epoch"], r["kind"], json.loads(r["payload"]),
                        r["created_at"]) for r in self.records]

    def signals(self) -> list[tuple[str, str]]:
        """(topic, signal body) of each row a pass of ``topic`` signals, in offset order
        per topic: each of the topic's own rows, and the statement's last row of every
        other topic of the family."""
        return [(r["topic"], r["signal"]) for r in self.records if r["signal"] is not None]


async def number_pending(conn: asyncpg.Pool | asyncpg.Connection, topic: str,
                         limit: int) -> Numbered:
    """Give the rows of at most ``limit`` committed pending entries (a row, or the rows of an
    entry with ``payloads``, migration 0023) of ``topic`` and of each topic of its family
    (``<topic>:...``, migration 0018) the next offsets of their topics, in one
    transaction of their own (the caller must not be inside one: the topics' numbering
    locks last until that transaction ends); returns the rows made, by topic, in offset
    order, with their signals."""
    return Numbered(topic, await conn.fetch(_NUMBER, topic, limit, INLINE_ROW_MAX_CHARS))


async def pending_topics(pool: asyncpg.Pool | asyncpg.Connection,
                         older_than_seconds: float) -> list[str]:
    """Topics with a pending row older than this: rows whose writer did not number them
    (it died after its commit, or PostgreSQL failed it in between)."""
    return [r["topic"] for r in await pool.fetch(
        "SELECT DISTINCT topic FROM feed_pending"
        " WHERE created_at < clock_timestamp() - make_interval(secs => $1)",
        float(older_than_seconds))]


async def publish(cache: AnyRedis, row: FeedRow, auto: AutoPipeline | None = None) -> None:
    """Signal a committed row on ``push:<topic>``; a failure is logged and swallowed
    (pub/sub is at-most-once; clients poll the feed to cure a missed signal). A small row
    rides along in the signal, so the receiving hub need not read it back. ``auto``: a
    coalescer on ``cache`` the signal may share a round trip in."""
    await publish_many(cache, [row], auto)


async def publish_many(cache: AnyRedis, rows: Sequence[FeedRow],
                       auto: AutoPipeline | None = None) -> None:
    """``publish`` for several committed rows, in one round trip."""
    await publish_signals(cache, _signals(rows), auto)


def publish_soon(cache: AnyRedis, rows: Sequence[FeedRow], auto: AutoPipeline | None) -> bool:
    """``publish_many`` without waiting for Redis (``channel.publish_bodies_soon``): the
    signals join ``auto``'s next flush, in order after what was queued on it before. False
    when they could not be queued that way (no coalescer, or a cluster's): then await
    ``publish_many``."""
    if auto is None or auto.cluster:
        return False
    return publish_bodies_soon(cache, signal_bodies(_signals(rows)), auto)


def _signals(rows: Sequence[FeedRow]) -> list[Signal]:
    return [(row.topic, row.offset, row.kind, row.epoch, row.wire) for row in rows]


async def append_and_publish(pool: asyncpg.Pool, cache: AnyRedis, topic: str, kind: str,
                             payload: dict[str, Any]) -> FeedRow:
    """Append in a transaction of its own, then signal after the commit."""
    async with pool.acquire() as conn, conn.transaction():
        row = await append(conn, topic, kind, payload)
    await publish(cache, row)
    return row


_READ = """
SELECT t.epoch AS topic_epoch, t.trimmed_through, t.last_offset,
       f."offset", f.epoch, f.kind, f.payload, f.created_at
FROM (SELECT $1::text AS topic) q
LEFT JOIN feed_topics t ON t.topic = q.topic
LEFT JOIN LATERAL (
    SELECT "offset", epoch, kind, payload, created_at FROM feed
    WHERE feed.topic = q.topic AND feed."offset" > $2
    ORDER BY "offset" LIMIT $3
) f ON true
ORDER BY f."offset"
"""


async def read_page(pool: asyncpg.Pool | asyncpg.Connection, topic: str, after: int,
                    limit: int) -> FeedPage:
    """Rows with offset > ``after`` in order (at most ``limit``), from one snapshot."""
    check_topic(topic)
    if after < 0:
        raise FeedError("after must be >= 0")
    check_offset(after)
    if not 1 <= limit <= MAX_READ_LIMIT:
        raise FeedError(f"limit must be 1-{MAX_READ_LIMIT}")
    records = await pool.fetch(_READ, topic, after, limit)
    head = records[0]
    if head["topic_epoch"] is None:  # topic never written: epoch 1, empty
        return FeedPage(topic, 1, 0, 0, [])
    rows = [FeedRow(topic, r["offset"], r["epoch"], r["kind"], r["payload"], r["created_at"])
            for r in records if r["offset"] is not None]
    return FeedPage(topic, head["topic_epoch"], head["trimmed_through"], head["last_offset"],
                    rows)


async def read(pool: asyncpg.Pool | asyncpg.Connection, topic: str, after: int,
               limit: int) -> tuple[int, list[FeedRow]]:
    """(epoch, rows with offset > after in order, at most limit)."""
    page = await read_page(pool, topic, after, limit)
    return page.epoch, page.rows


@dataclass(frozen=True)
class Head:
    """Where a topic stands: its epoch, newest offset, and how far retention trimmed it."""

    epoch: int = 1
    last_offset: int = 0
    trimmed_through: int = 0


async def heads(pool: asyncpg.Pool | asyncpg.Connection,
                topics: list[str]) -> dict[str, Head]:
    """The head of each topic in one query; never-written topics are ``Head()``."""
    records = await pool.fetch(
        "SELECT topic, epoch, last_offset, trimmed_through FROM feed_topics"
        " WHERE topic = ANY($1::text[])", topics)
    found = {r["topic"]: Head(r["epoch"], r["last_offset"], r["trimmed_through"])
             for r in records}
    return {topic: found.get(topic, Head()) for topic in topics}
