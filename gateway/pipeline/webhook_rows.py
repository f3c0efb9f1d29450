"""A stored webhook's feed row on ``webhook:<source>``, written by the store stage.

The row is appended (pending, without its offset) in the store stage's own transaction, so
it exists exactly when the document does, and the ingest request writes nothing to
PostgreSQL for it. Its kind is the event's type: the document's ``event`` (GitHub's
``X-GitHub-Event``, recorded at ingest), else the body's ``type`` (Standard Webhooks,
Stripe), else ``webhook``; its payload ``{item_id, type, summary}`` with the summary the
document's title or the first 500 characters of its text.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import asyncpg

from gateway.push import feed
from gateway.push.protocol import FeedError, check_topic
from gateway.push.sequencer import Sequencer

log = logging.getLogger("gateway.pipeline")

PREFIX = "webhook:"
DEFAULT_KIND = "webhook"
SUMMARY_CHARS = 500


def event_type(document: dict[str, Any]) -> str:
    """The event's type as the sender named it, or ``webhook``."""
    named = document.get("event")
    body = document.get("body")
    if not isinstance(named, str) and isinstance(body, dict):
        named = body.get("type")
    if not isinstance(named, str):
        return DEFAULT_KIND
    try:
        feed.check_row(named, {})
    except FeedError:  # empty, too long or unprintable: not fit for an SSE event line
        return DEFAULT_KIND
    return named


def row_for(item_id: str, document: Any) -> tuple[str, tuple[str, dict[str, Any]]] | None:
    """``(topic, (kind, payload))`` of a webhook item's document; None for other items."""
    if not item_id.startswith(PREFIX) or not isinstance(document, dict):
        return None
    source = document.get("source")
    if not isinstance(source, str):
        return None
    topic = PREFIX + source
    try:
        check_topic(topic)
    except FeedError:
        log.warning("webhook source %r is no topic name: no feed row for its events",
                    source[:100])
        return None
    kind = event_type(document)
    title, text = document.get("title"), document.get("text")
    summary = title if isinstance(title, str) else (text if isinstance(text, str) else "")
    return topic, (kind, {"item_id": item_id, "type": kind,
                          "summary": summary[:SUMMARY_CHARS]})


Items = Iterable[tuple[str, Any]]  # (item id, document)


async def append(conn: asyncpg.Connection, items: Items,
                 sequencer: Sequencer) -> list[Callable[[], Awaitable[None]]]:
    """Append the rows of the webhook items among ``items`` in the caller's transaction;
    returns what numbers and signals them after its commit (one callable per topic)."""
    by_topic: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for item_id, document in items:
        found = row_for(item_id, document)
        if found is not None:
            by_topic.setdefault(found[0], []).append(found[1])
    for topic, rows in by_topic.items():
        await feed.append_pending(conn, topic, rows)
    return [_numbering(sequencer, topic) for topic in by_topic]


def _numbering(sequencer: Sequencer, topic: str) -> Callable[[], Awaitable[None]]:
    async def number() -> None:
        await sequencer.number(topic)  # a failure leaves them to the sweeper

    return number
