"""``GET /v1/stream``: Server-Sent Events over the hub.

Order of a (re)connection: subscribe at the hub first, then read the feed after the client's
cursor, then merge what the hub offers, dropping every row at or below the offset already
sent for its topic. A row that skips ahead (offset > sent + 1) or carries a new epoch makes
the stream re-read the feed from its position, so the client sees each row once, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import HttpVersion11

from gateway.api.errors import ApiError
from gateway.push import feed, metrics
from gateway.push import hub as hub_module
from gateway.push.frames import Frame, event_text
from gateway.push.frames import chunk as chunk_frame
from gateway.push.hub import Disconnected, Hub, Subscriber
from gateway.push.protocol import (
    DISCONNECT_EVENT,
    FeedError,
    FeedRow,
    check_topic,
    format_cursor,
    parse_cursor,
)
from gateway.push.settings import PushSettings

log = logging.getLogger("gateway.push")


def parse_topics(text: str | None, limit: int) -> tuple[str, ...]:
    if not text:
        raise ApiError(400, "bad_request", "topics is required, e.g. ?topics=pipeline")
    topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not topics:
        raise ApiError(400, "bad_request", "topics is required, e.g. ?topics=pipeline")
    if len(topics) > limit:
        raise ApiError(400, "bad_request", f"at most {limit} topics per stream")
    try:
        for topic in topics:
            check_topic(topic)
    except FeedError as exc:
        raise ApiError(400, "bad_request", str(exc)) from None
    return topics


def parse_since(request: web.Request) -> dict[str, int]:
    text = request.headers.get("Last-Event-ID") or request.query.get("since") or ""
    try:
        return parse_cursor(text)
    except FeedError as exc:
        raise ApiError(400, "bad_request", f"Last-Event-ID/since: {exc}") from None


@dataclass
class _Position:
    epoch: int
    offset: int


class _Stream:
    """One client's stream: positions per topic, the response, and the merge logic."""

    def __init__(self, request: web.Request, pool: asyncpg.Pool, sub: Subscriber,
                 config: PushSettings, positions: dict[str, _Position]) -> None:
        self.request = request
        self.pool = pool
        self.sub = sub
        self.config = config
        self.positions = positions
        self.response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            # The starting position and epoch of every topic, for clients that start live.
            "X-Stream-Cursor": self.cursor(),
            "X-Stream-Epochs": ",".join(f"{t}:{p.epoch}" for t, p in positions.items()),
        })
        if request.version == HttpVersion11:
            # Explicit (aiohttp would choose it anyway) so the direct path knows the framing.
            self.response.enable_chunked_encoding()
        self.writer: AbstractStreamWriter | None = None
        self.transport: asyncio.Transport | None = None

    def cursor(self) -> str:
        if len(self.positions) == 1:  # the common case, once per event: keep it cheap
            ((topic, pos),) = self.positions.items()
            return f"{topic}:{pos.offset}"
        return format_cursor({t: p.offset for t, p in self.positions.items()})

    async def write(self, text: str) -> None:
        # No timeout here: the hub's housekeeping aborts a write stuck for too long.
        sub = self.sub
        sub.writing_since = time.monotonic()
        await self.response.write(text.encode())
        if self.writer is not None:
            # aiohttp drains only every 64 KiB it wrote itself; the direct path writes
            # around it, so wait here for a socket above its high-water mark.
            await self.writer.drain()
        sub.writing_since = None
        sub.last_write = time.monotonic()

    def _event(self, row: FeedRow) -> str:
        return event_text(self.cursor(), row)

    def direct(self, row: FeedRow, frame: Frame) -> bool:
        """Called by the hub, synchronously, while this stream's task is idle: write the
        row now if it is the next one for its topic and the socket is keeping up."""
        pos = self.positions.get(row.topic)
        transport = self.transport
        if (pos is None or row.epoch != pos.epoch or row.offset != pos.offset + 1
                or transport is None or transport.is_closing()
                or transport.get_write_buffer_size() > hub_module.HIGH_WATER):
            return False
        pos.offset = row.offset
        if len(self.positions) == 1:  # the id is "<topic>:<offset>": the shared bytes
            data = frame.chunked if self.response.chunked else frame.event
        else:
            data = self._event(row).encode()
            if self.response.chunked:
                data = chunk_frame(data)
        transport.write(data)
        self.sub.last_write = time.monotonic()
        return True

    def park(self) -> None:
        """Called by the subscriber when the task goes idle: a single-topic chunked stream
        joins its topic's lane, if its position is the lane's."""
        transport = self.transport
        if transport is not None and self.response.chunked and len(self.positions) == 1:
            ((pos),) = self.positions.values()
            self.sub.join_lane(transport, pos.epoch, pos.offset)

    def unpark(self, epoch: int, offset: int) -> None:
        """Back from the lane, which wrote every row up to ``offset``."""
        ((pos),) = self.positions.values()
        pos.epoch, pos.offset = epoch, offset

    async def replay(self, topics: tuple[str, ...]) -> None:
        """Send every row after the current positions of ``topics``, straight from the feed."""
        self.sub.catching_up = True
        try:
            again = True
            while again:
                self.sub.missed = False
                for topic in topics:
                    await self._replay_topic(topic)
                again = self.sub.missed
        finally:
            self.sub.catching_up = False

    async def _replay_topic(self, topic: str) -> None:
        pos = self.positions[topic]
        while True:
            page = await feed.read_page(self.pool, topic, pos.offset, self.config.page_rows)
            if page.epoch != pos.epoch:
                pos.epoch, pos.offset = page.epoch, 0  # reset: start the new epoch over
                continue
            if not page.rows:
                return
            chunks = []
            for row in page.rows:
                pos.offset = row.offset
                chunks.append(self._event(row))
            await self._flush(chunks)
            if len(page.rows) < self.config.page_rows:
                return

    async def deliver(self, rows: list[FeedRow]) -> None:
        chunks: list[str] = []
        for row in rows:
            pos = self.positions[row.topic]
            if row.epoch == pos.epoch and row.offset <= pos.offset:
                continue  # already sent (replay and live overlap)
            if row.epoch == pos.epoch and row.offset == pos.offset + 1:
                pos.offset = row.offset
                chunks.append(self._event(row))
                continue
            if row.epoch < pos.epoch:
                continue  # a straggler from before a reset
            # A gap or a new epoch: flush, then fill from the feed.
            await self._flush(chunks)
            chunks = []
            await self.replay((row.topic,))
        await self._flush(chunks)

    async def _flush(self, chunks: list[str]) -> None:
        if chunks:
            await self.write("".join(chunks))
            metrics.ROWS_SENT.inc(len(chunks))  # once per write, not per row

    async def run(self) -> None:
        self.writer = await self.response.prepare(self.request)
        self.transport = self.request.transport
        await self.write(": connected\n\n")
        self.sub.direct = self.direct
        self.sub.park, self.sub.unpark = self.park, self.unpark
        await self.replay(self.sub.topics)
        while True:
            rows = await self.sub.take()
            if rows:
                await self.deliver(rows)
            else:
                await self.write(": heartbeat\n\n")

    async def say_goodbye(self, reason: str) -> None:
        """The ``gateway.disconnect`` event: ``reason`` is the code clients act on
        (``shutdown``, ``too_slow``, ...); ``error`` repeats it in the JSON-error shape."""
        code, _, detail = reason.partition(": ")
        body = json.dumps({"reason": code, "error": code, "detail": detail or code})
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self.response.write(f"event: {DISCONNECT_EVENT}\ndata: {body}\n\n".encode()), 1.0)


async def stream(request: web.Request, hub: Hub, pool: asyncpg.Pool, config: PushSettings,
                 watch: Callable[[Subscriber], Coroutine[Any, Any, None]] | None = None
                 ) -> web.StreamResponse:
    """``watch`` runs beside the stream and may close the subscription (a credential that
    expired or was revoked): the client then gets ``gateway.disconnect`` with the reason."""
    topics = parse_topics(request.query.get("topics"), config.max_topics_per_stream)
    since = parse_since(request)
    sub = await hub.subscribe(topics)
    sub.transport = request.transport
    watcher = asyncio.create_task(watch(sub)) if watch is not None else None
    try:
        heads = await feed.heads(pool, list(topics))
        positions = {}
        for topic in topics:
            head = heads[topic]
            offset = since.get(topic, head.last_offset)
            if offset > head.last_offset:
                offset = 0  # a cursor past the head predates a reset: replay this epoch
            positions[topic] = _Position(head.epoch, offset)
        session = _Stream(request, pool, sub, config, positions)
        metrics.STREAMS.inc()
        try:
            await session.run()
        except Disconnected as exc:
            log.info("push: stream closed: %s", exc.reason)
            metrics.STREAM_CLOSED.labels(exc.reason.partition(":")[0]).inc()
            await session.say_goodbye(exc.reason)
        except (ConnectionError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.info("push: stream ended: %s", type(exc).__name__)
            metrics.STREAM_CLOSED.labels("error").inc()
        finally:
            metrics.STREAMS.dec()
        return session.response
    finally:
        if watcher is not None:
            watcher.cancel()
        hub.unsubscribe(sub)
