"""The feed's wire format, shared by the server and ``PushClient`` (which runs in other
people's processes and imports nothing else of the gateway): rows, topic names, the SSE
cursor and the disconnect event.

The cursor is ``<topic>:<offset>`` per topic, joined by commas; each part is split at its
last colon, because topics such as ``conversation:<id>`` contain colons.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# Named event the server sends right before it closes a stream on purpose.
DISCONNECT_EVENT = "gateway.disconnect"
# Offsets are PostgreSQL bigints; a larger one names no row and could not be queried.
MAX_OFFSET = 2**63 - 1

# Topics end up in SSE cursors ("<topic>:<offset>" joined by commas) and channel names.
TOPIC_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,200}$")


class FeedError(ValueError):
    """A topic, kind or cursor the feed refuses; the message is fit for a 400 answer."""


def check_topic(topic: str) -> str:
    if not isinstance(topic, str) or not TOPIC_RE.match(topic) or topic.endswith(":"):
        raise FeedError(
            "topic must be 1-200 characters of letters, digits and _ . : @ - "
            "(not ending in ':')")
    return topic


def topic_matches(pattern: str, topic: str) -> bool:
    """A pattern is a topic name, or a prefix ending in ``*``."""
    if pattern.endswith("*"):
        return topic.startswith(pattern[:-1])
    return pattern == topic


def covers(pattern: str, requested: str) -> bool:
    """Does ``pattern`` allow every topic ``requested`` (itself maybe a pattern) names?"""
    if pattern.endswith("*"):
        return requested.removesuffix("*").startswith(pattern[:-1])
    return pattern == requested


# json.dumps(..., separators=(",", ":")) builds an encoder per call; this one is built once.
_COMPACT = json.JSONEncoder(separators=(",", ":")).encode


@dataclass(frozen=True)
class FeedRow:
    topic: str
    offset: int
    epoch: int
    kind: str
    payload: dict[str, Any]
    created_at: datetime

    def to_json(self) -> dict[str, Any]:
        """The wire form: ``{topic, offset, epoch, kind, payload, created_at}``."""
        return {"topic": self.topic, "offset": self.offset, "epoch": self.epoch,
                "kind": self.kind, "payload": self.payload,
                "created_at": self.created_at.isoformat()}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> FeedRow:
        """The inverse of :meth:`to_json` (rows read from the HTTP API or a signal)."""
        return cls(str(body["topic"]), int(body["offset"]), int(body["epoch"]),
                   str(body["kind"]), dict(body["payload"]),
                   datetime.fromisoformat(str(body["created_at"])))

    @functools.cached_property
    def wire(self) -> str:
        """``to_json()`` as compact JSON text, encoded once however many streams send it."""
        return _COMPACT(self.to_json())


MAX_CURSOR_CHARS = 16384


def parse_cursor(text: str) -> dict[str, int]:
    """``"pipeline:12,conversation:7:3"`` → ``{"pipeline": 12, "conversation:7": 3}``."""
    if len(text) > MAX_CURSOR_CHARS:
        raise FeedError(f"cursor is longer than {MAX_CURSOR_CHARS} characters")
    positions: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        topic, colon, offset = part.rpartition(":")
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
        if not colon or not offset.isascii() or not offset.isdigit():
            raise FeedError(f"cursor part {part[:80]!r} is not <topic>:<offset>")
        if len(offset) > len(str(MAX_OFFSET)):  # int() refuses past 4300 digits anyway
            raise FeedError(f"an offset must be 0-{MAX_OFFSET}")
        positions[check_topic(topic)] = check_offset(int(offset))
    return positions


def check_offset(offset: int) -> int:
    if not 0 <= offset <= MAX_OFFSET:
        raise FeedError(f"an offset must be 0-{MAX_OFFSET}")
    return offset


def format_cursor(positions: Mapping[str, int]) -> str:
    return ",".join(f"{topic}:{offset}" for topic, offset in positions.items())
