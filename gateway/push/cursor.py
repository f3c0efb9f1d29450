"""The SSE cursor (DESIGN §6): ``<topic>:<offset>`` per topic, joined by commas; each part
is split at its last colon, because topics such as ``conversation:<id>`` contain colons."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.push.feed import FeedError, check_topic

MAX_CURSOR_CHARS = 16384


def parse(text: str) -> dict[str, int]:
    """``"pipeline:12,conversation:7:3"`` → ``{"pipeline": 12, "conversation:7": 3}``."""
    if len(text) > MAX_CURSOR_CHARS:
        raise FeedError(f"cursor is longer than {MAX_CURSOR_CHARS} characters")
    positions: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        topic, colon, offset = part.rpartition(":")
        if not colon or not offset.isdigit():
            raise FeedError(f"cursor part {part[:80]!r} is not <topic>:<offset>")
        positions[check_topic(topic)] = int(offset)
    return positions


def format_cursor(positions: Mapping[str, int]) -> str:
    return ",".join(f"{topic}:{offset}" for topic, offset in positions.items())
