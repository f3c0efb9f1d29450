"""SSE event bytes, built once per row and shared by every single-topic stream of the topic.

A single-topic stream's event id is ``<topic>:<offset>``: the same for every client of that
topic, so the hub encodes each row once per fan-out instead of once per client. A stream that
follows several topics carries a cursor of all of them and builds its own event.
"""

from __future__ import annotations

from gateway.push.protocol import FeedRow


def event_text(cursor: str, row: FeedRow) -> str:
    return f"id: {cursor}\nevent: {row.kind}\ndata: {row.wire}\n\n"


def chunk(data: bytes) -> bytes:
    """``data`` framed as one HTTP/1.1 chunk (what aiohttp's chunked writer sends)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class Frame:
    """One row's event for single-topic streams; each encoding is made on first use."""

    __slots__ = ("_chunk", "_event", "row")

    def __init__(self, row: FeedRow) -> None:
        self.row = row
        self._event: bytes | None = None
        self._chunk: bytes | None = None

    @property
    def event(self) -> bytes:
        if self._event is None:
            row = self.row
            self._event = event_text(f"{row.topic}:{row.offset}", row).encode()
        return self._event

    @property
    def chunked(self) -> bytes:
        if self._chunk is None:
            self._chunk = chunk(self.event)
        return self._chunk
