"""Feed retention and reset.

Retention trims a *prefix* of each topic (every offset up to a cut), never a hole in the
middle, and records the cut in ``feed_topics.trimmed_through``. A reader whose cursor is
below the cut gets the rows after the cut; ``GET /v1/feed`` says so with
``"trimmed_through"``, and the Python client reports the lost range instead of waiting for
rows that no longer exist. A reset deletes a topic's rows, restarts offsets at 1 and raises
its epoch, so every client knows its old offsets mean nothing any more; rows still waiting
for their offsets (``feed_pending``) go with them.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from gateway.push.channel import publish_signal
from gateway.push.protocol import check_topic
from gateway.push.settings import PushSettings
from gateway.stores.redis import AnyRedis

log = logging.getLogger("gateway.push")
_RETENTION_LOCK = 0x67777066  # one process trims at a time; the others skip the round

# Rows deleted per transaction. Moving ``trimmed_through`` locks the topic's counter row,
# which every writer of the topic needs: each step holds it for one bounded DELETE only.
TRIM_BATCH = 1000

_CUTS = """
SELECT t.topic, t.trimmed_through,
       GREATEST(
           t.last_offset - $2::bigint,
           COALESCE((SELECT max(f."offset") FROM feed f
                     WHERE f.topic = t.topic
                       AND f.created_at < clock_timestamp() - make_interval(secs => $1)), 0)
       ) AS upto
FROM feed_topics t
"""
# One step: move the cut (only from where this pass saw it: a reset in between wins), then
# delete the rows it passed, in one short transaction.
_MOVE_CUT = """
UPDATE feed_topics SET trimmed_through = $3 WHERE topic = $1 AND trimmed_through = $2
"""
_DELETE_UPTO = """
DELETE FROM feed WHERE topic = $1 AND "offset" > $2 AND "offset" <= $3
"""


async def trim(pool: asyncpg.Pool, *, max_age_seconds: float, max_rows: int) -> int:
    """Delete rows older than ``max_age_seconds`` or beyond the newest ``max_rows`` of their
    topic (as a prefix), ``TRIM_BATCH`` rows per transaction; returns how many rows went."""
    removed = 0
    async with pool.acquire() as conn:
        if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", _RETENTION_LOCK):
            return 0
        try:
            for cut in await conn.fetch(_CUTS, float(max_age_seconds), int(max_rows)):
                removed += await _trim_topic(conn, cut["topic"], cut["trimmed_through"],
                                             cut["upto"])
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _RETENTION_LOCK)
    return removed


async def _trim_topic(conn: asyncpg.Connection, topic: str, done: int, upto: int) -> int:
    removed = 0
    while done < upto:
        step = min(upto, done + TRIM_BATCH)
        async with conn.transaction():
            if await conn.execute(_MOVE_CUT, topic, done, step) != "UPDATE 1":
                return removed  # reset meanwhile: the cut starts again from there
            status = await conn.execute(_DELETE_UPTO, topic, done, step)
        removed += int(status.split()[-1])
        done = step
    return removed


async def reset(pool: asyncpg.Pool, cache: AnyRedis, topic: str) -> int:
    """Delete every row of ``topic``, restart its offsets and raise its epoch; returns the
    new epoch and signals it (offset 0, kind ``reset``)."""
    check_topic(topic)
    async with pool.acquire() as conn, conn.transaction():
        # Numbering passes of the topic wait; its rows still pending are deleted with the rest.
        await conn.execute("SELECT feed_topic_lock($1)", topic)
        await conn.execute("DELETE FROM feed_pending WHERE topic = $1", topic)
        epoch = await conn.fetchval(
            "INSERT INTO feed_topics AS t (topic, epoch) VALUES ($1, 2)"
            " ON CONFLICT (topic) DO UPDATE SET epoch = t.epoch + 1, last_offset = 0,"
            " trimmed_through = 0 RETURNING t.epoch", topic)
        await conn.execute("DELETE FROM feed WHERE topic = $1", topic)
    await publish_signal(cache, topic, 0, "reset", epoch)
    return int(epoch)


async def run_retention(pool: asyncpg.Pool, config: PushSettings, stop: asyncio.Event) -> None:
    """Trim every ``retention_interval_seconds`` until ``stop`` is set."""
    while not stop.is_set():
        try:
            removed = await trim(pool, max_age_seconds=config.retention_days * 86400,
                                 max_rows=config.retention_max_rows)
            if removed:
                log.info("feed retention removed %d rows", removed)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("feed retention failed: %s", exc)
        try:
            await asyncio.wait_for(stop.wait(), config.retention_interval_seconds)
        except TimeoutError:
            pass
