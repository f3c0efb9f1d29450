"""Publishing: an event of a client's own becomes a feed row, so streams, polling and
subscriptions all see it; idempotent on ``event_id`` per topic within the dedup window.

The claim on the id and the row are written in one transaction: the row takes its offset
from the topic's counter (``feed.append``, row-locked until the commit), and the claim
(``feed_events``) records that offset, so a repeat, even one racing the first, is answered
with the first one's offset. The gateway's own topics cannot be published to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from gateway.push import feed
from gateway.push.protocol import FeedError, FeedRow, check_topic
from gateway.stores.redis import AnyRedis

# Topics the gateway writes itself: a client publishing there would forge its rows
# (``gateway.*`` names its internal signals, such as the subscriptions' changes).
RESERVED = ("pipeline", "pipeline:*", "conversation:*", "webhook:*", "docs:*", "gateway.*")
MAX_EVENT_BYTES = 64 * 1024
MAX_EVENT_ID = 200
DEFAULT_KIND = "event"


def reserved(topic: str) -> bool:
    """Is ``topic`` one of the gateway's own (by name or by prefix)?"""
    return any(topic.startswith(p[:-1]) if p.endswith("*") else topic == p for p in RESERVED)


@dataclass(frozen=True)
class Event:
    kind: str
    payload: dict[str, Any]  # {"text"?, "data"?, "event_id"?}
    event_id: str | None


def parse_event(body: Any) -> Event:
    """The event of a request body, or ``FeedError`` saying what is wrong (a 400)."""
    if not isinstance(body, dict):
        raise FeedError("body must be a JSON object")
    unknown = sorted(set(body) - {"kind", "text", "data", "event_id"})
    if unknown:
        raise FeedError(f"unknown field(s): {', '.join(u[:40] for u in unknown[:5])}")
    kind = body.get("kind", DEFAULT_KIND)
    if not isinstance(kind, str):
        raise FeedError("kind must be a string")
    payload: dict[str, Any] = {}
    if "text" in body:
        if not isinstance(body["text"], str):
            raise FeedError("text must be a string")
        payload["text"] = body["text"]
    if "data" in body:
        if not isinstance(body["data"], dict):
            raise FeedError("data must be a JSON object")
        payload["data"] = body["data"]
    event_id = body.get("event_id")
    if event_id is not None:
        if (not isinstance(event_id, str) or not 1 <= len(event_id) <= MAX_EVENT_ID
                or not all(33 <= ord(c) < 127 for c in event_id)):
            raise FeedError(f"event_id must be 1-{MAX_EVENT_ID} printable ASCII characters, "
                            "no spaces")
        payload["event_id"] = event_id
    feed.check_row(kind, payload)
    return Event(kind, payload, event_id)


_CLAIM = """
INSERT INTO feed_events AS e (topic, event_id) VALUES ($1, $2)
ON CONFLICT (topic, event_id) DO UPDATE SET created_at = now(), "offset" = NULL
    WHERE e.created_at < now() - make_interval(secs => $3)
RETURNING 1
"""


@dataclass(frozen=True)
class Published:
    offset: int
    duplicate: bool


async def publish(pool: asyncpg.Pool, cache: AnyRedis, topic: str, event: Event,
                  window_seconds: float) -> Published:
    """Append ``event`` to ``topic`` and signal it after the commit; with an ``event_id``
    seen on the topic within ``window_seconds``, append nothing and answer the first
    one's offset."""
    check_topic(topic)
    row: FeedRow | None = None
    async with pool.acquire() as conn, conn.transaction():
        if event.event_id is not None and await conn.fetchval(
                _CLAIM, topic, event.event_id, float(window_seconds)) is None:
            offset = await conn.fetchval(
                'SELECT "offset" FROM feed_events WHERE topic = $1 AND event_id = $2',
                topic, event.event_id)
            return Published(int(offset or 0), True)
        row = await feed.append(conn, topic, event.kind, event.payload)
        if event.event_id is not None:
            await conn.execute(
                'UPDATE feed_events SET "offset" = $3 WHERE topic = $1 AND event_id = $2',
                topic, event.event_id, row.offset)
    await feed.publish(cache, row)
    return Published(row.offset, False)


async def purge(pool: asyncpg.Pool, window_seconds: float, limit: int = 10_000) -> int:
    """Forget event ids older than the window (at most ``limit`` per call, so one call
    holds nothing long); returns how many went."""
    status = await pool.execute(
        "DELETE FROM feed_events WHERE ctid IN (SELECT ctid FROM feed_events"
        " WHERE created_at < now() - make_interval(secs => $1) LIMIT $2)",
        float(window_seconds), limit)
    return int(status.split()[-1])
