"""One fan-out hub per process: a single Redis subscriber and a single feed reader per topic,
shared by every SSE client of that process.

A signal only says "topic T has offset N now". The hub reads the new rows from the feed once
(``offset > head``, so a lost signal is cured by the next one or by the poll) and offers each
row to every local subscriber's bounded buffer. A subscriber whose buffer is full is closed
with a reason instead of growing memory. While redis-cache is unreachable the hub polls the
feed every ``degraded_poll_seconds``; when it comes back, every topic is re-read at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from gateway.push import feed, metrics
from gateway.push.channel import SignalListener
from gateway.push.frames import Frame
from gateway.push.protocol import FeedRow
from gateway.push.settings import PushSettings
from gateway.stores.redis import AnyRedis

log = logging.getLogger("gateway.push")
# How often the hub checks every stream for heartbeats due, departed clients, stuck writes.
HOUSEKEEPING_SECONDS = 1.0
# The hub writes a row straight to a client's socket only while less than this waits in its
# send buffer (asyncio's default high-water mark); above it rows wait in the subscriber's
# bounded buffer and the stream's task writes them, waiting for the socket to drain.
HIGH_WATER = 64 * 1024


class Disconnected(Exception):
    """The hub closed this subscriber; ``reason`` says why (sent to the client)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Subscriber:
    """One client's bounded buffer of rows offered by the hub.

    The hub also watches it (``housekeep``): a heartbeat when the stream was quiet for
    ``heartbeat_seconds``, a close when the client went away, and an abort when a write has
    been stuck for ``write_timeout_seconds`` (a client that stopped reading). A deque and
    one future rather than an ``asyncio.Queue``: the fan-out calls ``offer`` once per row
    per client, so its cost is the hub's cost.

    The fast paths. While the stream's task sits idle in ``take`` with nothing buffered, it
    first asks ``park`` (set by a single-topic stream) to put it in its topic's lane, where
    the hub writes each next row's shared frame to the socket in one loop over the lane (see
    ``_Topic``); when it leaves the lane, ``unpark`` gets the position the lane brought it
    to. Outside the lane, ``offer`` hands the row to ``direct`` (set by the stream), which
    writes the ``Frame`` to the socket right there in the hub's dispatch, without waking the
    task. Both decline (and the row is buffered as before) when the row is not the next one
    for the stream or the socket's send buffer is above ``HIGH_WATER``.
    """

    def __init__(self, topics: tuple[str, ...], max_rows: int) -> None:
        self.topics = topics
        self.max_rows = max_rows
        self.closed: str | None = None
        self.closed_at = 0.0
        # While the client replays a backlog from the feed, live rows it cannot buffer are
        # dropped and ``missed`` set: the replay re-reads them from the feed afterwards.
        self.catching_up = False
        self.missed = False
        self.transport: asyncio.Transport | None = None
        self.last_write = time.monotonic()
        self.writing_since: float | None = None
        self._rows: deque[FeedRow] = deque()
        self._beat_due = False
        self._waiter: asyncio.Future[None] | None = None
        self.direct: Callable[[FeedRow, Frame], bool] | None = None
        self.home: _Topic | None = None  # its topic, when it follows exactly one
        self.in_lane = False
        self.park: Callable[[], None] | None = None
        self.unpark: Callable[[int, int], None] | None = None

    def join_lane(self, transport: asyncio.Transport, epoch: int, offset: int) -> None:
        """Enter the topic's lane if the stream's position is the lane's (called by
        ``park`` from ``take``, so only while idle with nothing buffered)."""
        home = self.home
        if home is not None and not self._rows and self.closed is None and not self._beat_due:
            home.join(self, transport, epoch, offset)

    def left_lane(self, epoch: int, offset: int, written_at: float) -> None:
        self.in_lane = False
        self.last_write = max(self.last_write, written_at)
        if self.unpark is not None:
            self.unpark(epoch, offset)

    def _wake(self) -> None:
        if self.in_lane and self.home is not None:
            self.home.leave(self)  # the task takes over from here, at the lane's position
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def offer(self, row: FeedRow, frame: Frame | None = None) -> bool:
        """Write ``row`` at once (True) or buffer it for the stream's task (False)."""
        if self.closed is not None:
            return False
        waiter = self._waiter
        if (frame is not None and self.direct is not None and not self._rows
                and waiter is not None and not waiter.done() and self.direct(row, frame)):
            return True
        if len(self._rows) >= self.max_rows:
            if self.catching_up:
                self.missed = True
            else:
                self.close(f"too_slow: more than {self.max_rows} rows waiting for this client")
            return False
        self._rows.append(row)
        self._wake()
        return False

    def beat(self) -> None:
        if self.closed is None and not self._rows:
            self._beat_due = True
            self._wake()

    def close(self, reason: str) -> None:
        """Drop what is buffered (memory goes back at once) and wake the reader."""
        if self.closed is not None:
            return
        self.closed, self.closed_at = reason, time.monotonic()
        self._rows.clear()
        self._wake()

    async def take(self) -> list[FeedRow]:
        """Every buffered row (waiting for one), or [] when a heartbeat is due; raises
        Disconnected once closed."""
        while True:
            if self.closed is not None:
                raise Disconnected(self.closed)
            if self._rows:
                rows = list(self._rows)
                self._rows.clear()
                self._beat_due = False
                return rows
            if self._beat_due:
                self._beat_due = False
                return []
            if self.park is not None:
                self.park()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
                if self.in_lane and self.home is not None:  # cancelled while in the lane
                    self.home.leave(self)

    def housekeep(self, now: float, heartbeat: float, write_timeout: float) -> None:
        transport = self.transport
        if self.in_lane and self.home is not None:
            self.last_write = max(self.last_write, self.home.lane_at)
        if self.closed is not None:
            if transport is not None and now - self.closed_at > write_timeout:
                transport.abort()  # its writer is stuck on a client that does not read
            return
        if transport is not None and transport.is_closing():
            self.close("gone: the client closed the connection")
        elif self.writing_since is not None and now - self.writing_since > write_timeout:
            self.close(f"too_slow: a write did not finish in {write_timeout:g} s")
            if transport is not None:
                transport.abort()
        elif now - self.last_write >= heartbeat:
            self.beat()


@dataclass
class _Topic:
    """One topic's subscribers, split into the lane and the rest (``outside``).

    The lane holds idle single-topic streams whose position is the last row fanned out for
    the topic (``lane_epoch``, ``lane_offset``). The next row (exactly one further, same
    epoch) is written to every lane member's transport in one tight loop, the same encoded
    chunk for all, with no call into the subscriber or the stream: what a bare fan-out costs,
    plus a closing and a send-buffer check. A member whose socket is closing or above
    ``HIGH_WATER`` leaves before the row (so at the position before it) and gets the row
    through ``offer`` like every subscriber outside; any other row empties the lane first.
    Members leave, at the lane's position, whenever their task must run (a heartbeat, a
    close, a cancellation).
    """

    name: str
    epoch: int = 1
    head: int | None = None  # None until the first read after the subscription
    subscribers: set[Subscriber] = field(default_factory=set)
    dirty: bool = False
    task: asyncio.Task[None] | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    lane: dict[Subscriber, asyncio.Transport] = field(default_factory=dict)
    outside: set[Subscriber] = field(default_factory=set)
    lane_epoch: int = 0
    lane_offset: int = -1  # no row known yet: nobody can join
    lane_at: float = 0.0  # when the lane last wrote (its members' last write)

    def add(self, sub: Subscriber) -> None:
        self.subscribers.add(sub)
        self.outside.add(sub)

    def discard(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        self.outside.discard(sub)
        if self.lane.pop(sub, None) is not None:
            sub.in_lane = False

    def join(self, sub: Subscriber, transport: asyncio.Transport, epoch: int,
             offset: int) -> None:
        if (epoch == self.lane_epoch and offset == self.lane_offset and sub in self.outside
                and not transport.is_closing()):
            self.outside.discard(sub)
            self.lane[sub] = transport
            sub.in_lane = True

    def leave(self, sub: Subscriber) -> None:
        if self.lane.pop(sub, None) is not None:
            self.outside.add(sub)
            sub.left_lane(self.lane_epoch, self.lane_offset, self.lane_at)

    def moved(self, epoch: int, offset: int) -> None:
        """The hub's position changed without a fan-out (its first head read)."""
        for sub in list(self.lane):
            self.leave(sub)
        self.lane_epoch, self.lane_offset = epoch, offset

    def fanout(self, row: FeedRow) -> None:
        """Offer ``row`` to every subscriber of the topic, sharing one encoding of it."""
        frame = Frame(row)
        written = 0
        if self.lane:
            if row.epoch == self.lane_epoch and row.offset == self.lane_offset + 1:
                written = self._write_lane(frame.chunked)
            else:
                for sub in list(self.lane):
                    self.leave(sub)
        self.lane_epoch, self.lane_offset = row.epoch, row.offset
        for sub in list(self.outside):
            written += sub.offer(row, frame)
        if written:
            metrics.ROWS_SENT.inc(written)  # once per row, not per client

    def _write_lane(self, data: bytes) -> int:
        behind = None
        high_water = HIGH_WATER
        for sub, transport in self.lane.items():
            if transport.is_closing() or transport.get_write_buffer_size() > high_water:
                behind = behind or []
                behind.append(sub)
                continue
            transport.write(data)
        self.lane_at = time.monotonic()
        for sub in behind or ():
            self.leave(sub)  # before the lane moves on: it has not had this row
        return len(self.lane)


class Hub:
    def __init__(self, pool: asyncpg.Pool, cache: AnyRedis, config: PushSettings) -> None:
        self.pool = pool
        self.config = config
        self.listener = SignalListener(cache, self._on_signal, self._on_state)
        self.topics: dict[str, _Topic] = {}
        self.signals_up = False
        self._poke = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()

    # --- subscribers -------------------------------------------------------------------

    async def subscribe(self, topics: Iterable[str]) -> Subscriber:
        """Register a subscriber; returns once each topic's signal subscription is confirmed
        (or timed out: then polling carries it) and the hub knows each topic's head."""
        names = tuple(dict.fromkeys(topics))
        sub = Subscriber(names, self.config.client_buffer_rows)
        fresh = []
        for name in names:
            state = self.topics.get(name)
            if state is None:
                state = self.topics[name] = _Topic(name)
                fresh.append(state)
            state.add(sub)
            if len(names) == 1:
                sub.home = state
        if fresh:
            await asyncio.gather(*(self.listener.add(s.name, self.config.subscribe_timeout_seconds)
                                   for s in fresh))
            for state in fresh:
                self._wake(state)
        for name in names:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.topics[name].ready.wait(),
                                       self.config.subscribe_timeout_seconds)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        for name in sub.topics:
            state = self.topics.get(name)
            if state is None:
                continue
            state.discard(sub)
            if not state.subscribers:
                del self.topics[name]
                if state.task is not None:
                    state.task.cancel()
                self._spawn(self._forget(name))

    async def _forget(self, name: str) -> None:
        if name not in self.topics:  # nobody subscribed again in the meantime
            await self.listener.remove(name)

    def close_all(self, reason: str) -> None:
        for state in self.topics.values():
            for sub in list(state.subscribers):
                sub.close(reason)

    @property
    def subscriber_count(self) -> int:
        return len({sub for state in self.topics.values() for sub in state.subscribers})

    # --- reading the feed ----------------------------------------------------------------

    def _on_signal(self, body: dict[str, Any]) -> None:
        state = self.topics.get(body["topic"])
        if state is None:
            return
        if state.head is None or body["epoch"] != state.epoch or body["offset"] > state.head:
            if not self._take_inline(state, body):
                metrics.FEED_READS.labels("signal").inc()
                self._wake(state)

    def _take_inline(self, state: _Topic, body: dict[str, Any]) -> bool:
        """Offer the row the signal carries when it is exactly the next one and no read is
        in flight (that read decides the order); otherwise the feed is read."""
        inline = body.get("row")
        if (not isinstance(inline, dict) or state.head is None
                or (state.task is not None and not state.task.done())
                or body["epoch"] != state.epoch or body["offset"] != state.head + 1):
            return False
        try:
            row = feed.FeedRow.from_json(inline)
        except (KeyError, TypeError, ValueError):
            return False
        if (row.topic, row.offset, row.epoch) != (state.name, body["offset"], state.epoch):
            return False
        state.head = row.offset
        state.fanout(row)
        return True

    def _on_state(self, up: bool) -> None:
        changed = up != self.signals_up
        self.signals_up = up
        metrics.SIGNALS_UP.set(1 if up else 0)
        if up:  # signals sent while we were away are gone: re-read every topic
            for state in list(self.topics.values()):
                self._wake(state)
        if changed:
            self._poke.set()

    def _wake(self, state: _Topic) -> None:
        state.dirty = True
        if state.task is None or state.task.done():
            state.task = asyncio.create_task(self._refresh(state))

    async def _refresh(self, state: _Topic) -> None:
        """Read rows after the hub's head until none are left, offering each to subscribers."""
        try:
            while state.dirty:
                state.dirty = False
                if state.head is None:
                    head = (await feed.heads(self.pool, [state.name]))[state.name]
                    state.epoch, state.head = head.epoch, head.last_offset
                    state.moved(head.epoch, head.last_offset)
                    state.ready.set()
                    continue
                page = await feed.read_page(self.pool, state.name, state.head,
                                            self.config.page_rows)
                if page.epoch != state.epoch:  # reset: the new epoch starts at offset 1
                    state.epoch, state.head, state.dirty = page.epoch, 0, True
                    continue
                for row in page.rows:
                    state.fanout(row)
                    state.head = row.offset
                if len(page.rows) == self.config.page_rows:
                    state.dirty = True
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("push: reading feed %s failed (%s); the poll retries",
                        state.name, type(exc).__name__)

    async def _poll(self) -> None:
        """Wake every topic whose head moved without a signal reaching us, and every topic
        whose first read failed (it has no head to compare yet)."""
        for state in self.topics.values():
            if state.head is None:
                self._wake(state)
        known = [s for s in self.topics.values() if s.head is not None]
        if not known:
            return
        heads = await feed.heads(self.pool, [s.name for s in known])
        for state in known:
            head = heads[state.name]
            if head.epoch != state.epoch or head.last_offset != state.head:
                metrics.FEED_READS.labels("poll").inc()
                self._wake(state)

    # --- lifecycle -------------------------------------------------------------------------

    async def _housekeeping(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = time.monotonic()
            subs = {sub for state in self.topics.values() for sub in state.subscribers}
            for sub in subs:
                sub.housekeep(now, self.config.heartbeat_seconds,
                              self.config.write_timeout_seconds)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(HOUSEKEEPING_SECONDS,
                                                        self.config.heartbeat_seconds / 2))

    async def run(self, stop: asyncio.Event) -> None:
        listener = asyncio.create_task(self.listener.run(stop))
        self._spawn(self._housekeeping(stop))
        try:
            while not stop.is_set():
                interval = (self.config.poll_seconds if self.signals_up
                            else self.config.degraded_poll_seconds)
                self._poke.clear()
                await _first_of(interval, self._poke.wait(), stop.wait())
                if stop.is_set():
                    break
                try:
                    await self._poll()
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                    log.warning("push: feed poll failed (%s)", type(exc).__name__)
        finally:
            stop.set()
            listener.cancel()  # its read waits up to a second; closing now is safe
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            for state in self.topics.values():
                if state.task is not None:
                    state.task.cancel()
            for task in list(self._background):
                task.cancel()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def _first_of(timeout: float, *coros: Any) -> None:
    """Wait until the first of ``coros`` finishes or ``timeout`` passes; cancel the rest."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
