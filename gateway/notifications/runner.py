"""One subscription's delivery: one row at a time, in offset order, the cursor moved only
after the destination took the row.

The loop: find the next row after the cursor (the oldest first across the topics a prefix
covers), skip it if its kind is not wanted, send it, and settle the outcome:
- taken: move the cursor (and wait for that write) before the next row, so a process killed
  at any point repeats at most the row in flight; the next row is read and made ready to
  send meanwhile, never sent;
- ``429`` + ``Retry-After``: wait as asked, not a failure;
- ``410``: pause with ``last_error``;
- anything else: a failure of the head row, tried again after the schedule's next delay
  (jittered) while the later rows wait; past ``give_up_after_seconds`` since its first
  failure the row is recorded under the subscription's failures and skipped; a subscription
  failing for ``disable_after_seconds`` without a success is paused.
The failure bookkeeping is written to the subscription's row, so a successor keeps the same
schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import asyncpg

from gateway.notifications import held as statements
from gateway.notifications import metrics
from gateway.notifications.chat import MAX_DIGEST_ROWS, ChatSender
from gateway.notifications.cursors import CursorWriter
from gateway.notifications.held import Held
from gateway.notifications.outcome import Outcome
from gateway.notifications.rows import Rows
from gateway.notifications.settings import NotificationSettings
from gateway.push.protocol import FeedRow

log = logging.getLogger("gateway.notifications")

JITTER = 0.2  # each delay is drawn within +-20 %, so failing endpoints do not retry in step
LOOK_MARGIN = 5.0  # a marked message is looked for from this long before the mark was written
STORE_RETRY_SECONDS = 1.0


class Sender(Protocol):
    async def send(self, row: FeedRow) -> Outcome: ...

    def prepare(self, row: FeedRow) -> None:
        """Make ``row``'s request ready ahead of its send (which may never come)."""


AnySender = Sender | ChatSender


@dataclass
class Context:
    """What every runner of a process shares."""

    pool: asyncpg.Pool  # the engine's (asynchronous commits)
    rows: Rows
    writer: CursorWriter
    settings: NotificationSettings
    heads: dict[str, tuple[int, int]]  # topic -> (epoch, last offset)
    lease_valid: Callable[[int], bool]  # partition -> is its lease still ours (locally)
    changed: Callable[[], None]  # ask the engine to reload (a fence or version moved on)


class Runner:
    def __init__(self, held: Held, context: Context, sender: AnySender) -> None:
        self.held = held
        self.context = context
        self.sender = sender
        self.wake = asyncio.Event()
        self.stopping = False
        self.stale = False  # a write was refused: wait for the engine's reload
        self.in_flight = False
        self.hold_until = 0.0  # a 429's Retry-After: nothing is sent before (no failure)
        self.dirty: dict[str, tuple[int, int]] = {}  # skipped-past positions not yet written
        self.task: asyncio.Task[None] | None = None
        self.delivered = metrics.DELIVERED.labels(held.type)
        self.failed = metrics.FAILED.labels(held.type)

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name=f"notify:{self.held.id}")

    def update(self, fresh: Held) -> None:
        """The subscription as reloaded. Its position and failures are this runner's own
        unless a replay (a new version) or a refused write made them stale; a pause is
        taken as is, a resume with what it cleared (the head is tried at once). Woken only
        when something changed."""
        held = self.held
        if fresh.version != held.version or self.stale:
            self.dirty.clear()
            self.held = fresh
        elif fresh.state != held.state:
            held.state, held.last_error = fresh.state, fresh.last_error
            if fresh.state == "active":
                held.retry_at, held.failing_since = fresh.retry_at, fresh.failing_since
                self.hold_until = 0.0
        else:
            return
        self.stale = False
        self.wake.set()

    async def stop(self, grace: float) -> None:
        """Let the row in flight finish (up to ``grace`` seconds), then cancel."""
        self.stopping = True
        self.wake.set()
        if self.task is None:
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(self.task), grace)
        if not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task

    async def run(self) -> None:
        recovered = False
        while not self.stopping:
            if not recovered and self.held.state == "active" and not self.stale:
                try:
                    await self.recover()
                    recovered = True
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the platform or a store: look again shortly
                    log.warning("subscription %s: look for its last message failed: %s",
                                self.held.id, type(exc).__name__)
                    await self._sleep(STORE_RETRY_SECONDS)
                    continue
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a store outage: look again in a moment
                log.warning("subscription %s: %s: %s", self.held.id, type(exc).__name__, exc)
                await self._sleep(STORE_RETRY_SECONDS)

    async def _step(self) -> None:
        self.wake.clear()
        held = self.held
        if held.state != "active" or self.stale or not self.context.lease_valid(held.part):
            await self.wake.wait()
            return
        until = max(held.retry_at or 0.0, self.hold_until)
        if until > time.time():
            await self._sleep(until - time.time())
            return
        row = await self._next_row(held)
        if row is None:
            await self._write_skipped()
            if not self.wake.is_set():
                await self.wake.wait()
            return
        if not held.wants(row.kind):
            held.cursors[row.topic] = self.dirty[row.topic] = (row.offset, row.epoch)
            return
        self.in_flight = True
        try:
            # The row is settled against the subscription as it was sent: a replay meanwhile
            # (a new version) makes its cursor write refused, not move the new position.
            if isinstance(self.sender, ChatSender):
                await self._post(held, row, self.sender)
            else:
                await self._settle(held, row, await self.sender.send(row))
        finally:
            self.in_flight = False

    async def _post(self, held: Held, row: FeedRow, sender: ChatSender) -> None:
        """A chat message: after the platform limits, the row and every row of its topic that
        waits behind it (a digest, as many as one message holds), marked before the post."""
        await sender.admit()
        lines, last = await self._gather(held, row, sender)
        mark = f"{held.id}:{row.topic}:{row.epoch}:{last.offset}"
        message = {"topic": row.topic, "to": last.offset, "epoch": row.epoch, "mark": mark,
                   "at": time.time()}
        if not await statements.sending(self.context.pool, held, message):
            self._lost()
            return
        held.sending = message
        outcome = await sender.send(sender.text(row.topic, lines), mark)
        await self._settle(held, row, outcome, last)

    async def _gather(self, held: Held, first: FeedRow,
                      sender: ChatSender) -> tuple[list[str], FeedRow]:
        """The lines of ``first`` and of the rows of its topic after it that are already
        there and fit one message (rows of unwanted kinds passed over); and the last row
        looked at, where the cursor goes once the message is taken."""
        lines = [sender.line(first)]
        size, last = len(lines[0]), first
        while len(lines) < MAX_DIGEST_ROWS:
            epoch, head = self.context.heads.get(first.topic, (first.epoch, first.offset))
            if epoch != first.epoch or head <= last.offset:
                break
            row = await self.context.rows.after(first.topic, last.offset, first.epoch)
            if row is None or row.epoch != first.epoch:
                break
            if not held.wants(row.kind):
                last = row
                continue
            line = sender.line(row)
            if not sender.fits(first.topic, len(lines) + 1, size + 1 + len(line)):
                break
            lines.append(line)
            size += 1 + len(line)
            last = row
        return lines, last

    async def recover(self) -> None:
        """A chat message its predecessor was posting when it stopped: if the platform shows
        it, the rows it covered are delivered (the cursor moves past them, nothing posted);
        otherwise they go out again (on Telegram, which cannot be asked, that may show them
        twice)."""
        held, sender = self.held, self.sender
        message = held.sending
        if not message or not isinstance(sender, ChatSender):
            return
        if sender.can_look and await sender.posted(str(message["mark"]),
                                                   float(message["at"]) - LOOK_MARGIN):
            log.info("subscription %s: message %s was posted before its holder stopped",
                     held.id, message["mark"])
            await self._move(held, str(message["topic"]), int(message["to"]),
                             int(message["epoch"]), delivered=True)
        elif not sender.can_look:
            log.warning("subscription %s: message %s may show twice (%s cannot be asked)",
                        self.held.id, message["mark"], sender.platform)

    async def _next_row(self, held: Held) -> FeedRow | None:
        heads = self.context.heads
        topics = [held.topic] if not held.topic.endswith("*") else [
            t for t in heads if held.follows(t)]
        best: FeedRow | None = None
        for topic in topics:
            head = heads.get(topic)
            if head is None:
                continue
            epoch, last = head
            offset, at = held.position(topic)
            if at is not None and at != epoch:  # the topic was reset: its new rows, from 1
                offset = 0
                held.cursors[topic] = (0, epoch)
            if last <= offset:
                continue
            row = await self.context.rows.after(topic, offset, epoch)
            if row is not None and (best is None or row.created_at < best.created_at):
                best = row
        return best

    async def _settle(self, held: Held, row: FeedRow, outcome: Outcome,
                      last: FeedRow | None = None) -> None:
        """``row`` was sent (with the rows up to ``last``, a digest's): settle the outcome."""
        last = last or row
        if outcome.kind == "ok":
            self.delivered.inc()
            # The next row of the topic is read and made ready to send (its body encoded,
            # signed) while the cursor write is on its way; it is sent only after that write
            # committed, like any row.
            ahead = asyncio.create_task(self._ready_next(last))
            try:
                await self._move(held, last.topic, last.offset, last.epoch, delivered=True)
            except BaseException:
                ahead.cancel()
                raise
            await ahead
            return
        if outcome.kind == "wait":  # 429 + Retry-After: as asked, not a failure
            self.hold_until = time.time() + min(
                outcome.wait, self.context.settings.max_retry_after_seconds)
            return
        self.failed.inc()
        pool = self.context.pool
        if outcome.kind == "gone":
            await self._pause(held, f"the endpoint answered 410 Gone ({outcome.detail[:200]})")
            return
        now = time.time()
        settings = self.context.settings
        held.head_failures += 1
        held.head_failing_since = held.head_failing_since or now
        held.failing_since = held.failing_since or now
        held.last_error = outcome.detail[:500]
        if now - held.failing_since >= settings.disable_after_seconds:
            await self._pause(held, f"failing for {now - held.failing_since:.0f} s: "
                                    f"{outcome.detail[:200]}")
            return
        if now - held.head_failing_since >= settings.give_up_after_seconds:
            await self._give_up(held, row)
            return
        delay = settings.retry_delay(held.head_failures) * random.uniform(1 - JITTER, 1 + JITTER)
        held.retry_at = min(now + max(delay, outcome.wait),
                            held.head_failing_since + settings.give_up_after_seconds)
        if not await statements.failed(pool, held):
            self._lost()

    async def _move(self, held: Held, topic: str, offset: int, epoch: int, *,
                    delivered: bool) -> None:
        """Write the cursor to ``offset`` (retrying the write, never the send: the rows were
        taken), then forget the head's failures."""
        while True:
            try:
                moved = await self.context.writer.move(held, topic, offset, epoch, delivered)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("subscription %s: cursor write failed (%s); retrying",
                            held.id, type(exc).__name__)
                await asyncio.sleep(STORE_RETRY_SECONDS)
        if not moved:
            self._lost()
            return
        held.cursors[topic] = (offset, epoch)
        self.dirty.pop(topic, None)
        held.head_failures, held.head_failing_since, held.retry_at = 0, None, None
        held.sending = None
        if delivered:
            held.failing_since = None

    async def _ready_next(self, row: FeedRow) -> None:
        """The row after ``row`` on its topic, read (a page at a time, into the shared rows)
        and prepared by the sender; nothing is sent. Never raises: the next step reads it
        again if this failed."""
        epoch, head = self.context.heads.get(row.topic, (row.epoch, row.offset))
        if epoch != row.epoch or head <= row.offset:
            return
        try:
            found = await self.context.rows.after(row.topic, row.offset, row.epoch)
            if (found is not None and found.epoch == row.epoch and self.held.wants(found.kind)
                    and not isinstance(self.sender, ChatSender)):
                self.sender.prepare(found)
        except Exception as exc:  # a store outage: the next step meets it and says so
            log.debug("subscription %s: reading ahead failed: %s", self.held.id,
                      type(exc).__name__)

    async def _write_skipped(self) -> None:
        """Going idle: write the positions of rows skipped for their kind."""
        for topic, (offset, epoch) in list(self.dirty.items()):
            if not await self.context.writer.move(self.held, topic, offset, epoch, False):
                self._lost()
                return
            if self.dirty.get(topic) == (offset, epoch):
                del self.dirty[topic]

    async def _give_up(self, held: Held, row: FeedRow) -> None:
        metrics.GIVEN_UP.labels(held.type).inc()
        log.info("subscription %s: %s:%s given up after %d attempts", held.id, row.topic,
                 row.offset, held.head_failures)
        if not await statements.give_up(self.context.pool, held, row.topic, row.offset,
                                        row.epoch, row.kind):
            self._lost()
            return
        held.cursors[row.topic] = (row.offset, row.epoch)
        held.head_failures, held.head_failing_since, held.retry_at = 0, None, None

    async def _pause(self, held: Held, error: str) -> None:
        log.info("subscription %s paused: %s", held.id, error)
        if await statements.pause(self.context.pool, held, error):
            held.state, held.last_error = "paused", error
        else:
            self._lost()

    def _lost(self) -> None:
        """A write was refused (another holder, or a replay): wait for the reload."""
        self.stale = True
        self.context.changed()

    async def _sleep(self, seconds: float) -> None:
        """Sleep, or less when woken (a change to the subscription)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), max(0.0, seconds))
