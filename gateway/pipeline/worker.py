"""Pipeline workers: fetch an item, heartbeat while its handler runs, journal + complete, or
fail; on stop, finish in-flight items (or release them after a grace period).

Ordering per item: handler results, the journal row and the feed rows (pending, without
their offsets: one on ``pipeline``, the operators' topic, one on ``pipeline:<owner>``, the
item's owner's) commit in one PostgreSQL transaction; then the process's ``Sequencer``
numbers and signals the feed rows, and only then COMPLETE acknowledges in Redis. A crash between the
commit and COMPLETE leaves the item leased; RECLAIM returns it, the next worker finds its
journal row and acknowledges without running the handler again, so each stage's effects
happen once; a feed row left pending is numbered by the next pass or a sweep.

A handler's ``prepare`` (``gateway.pipeline.handlers``) runs before that transaction with no
connection held, so a slow model call never keeps a transaction open.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from gateway import keys
from gateway.config import Settings, positive_numbers
from gateway.leases.maintenance import REFRESH_SECONDS, view_for
from gateway.pipeline import metrics, queue, webhook_rows
from gateway.pipeline.batching import BatchSizer
from gateway.pipeline.handlers import (
    NO_CONNECTION,
    Deferred,
    Handler,
    PermanentError,
    StageContext,
)
from gateway.pipeline.stages import (
    FEED_TOPIC,
    PRIORITY_BASE,
    STAGES,
    TYPE_BONUS,
    next_stage,
    progress_topic,
    seen_key,
)
from gateway.push.feed import check_row
from gateway.push.protocol import check_topic
from gateway.push.sequencer import Sequencer
from gateway.stores.postgres import GatewayConnection

log = logging.getLogger("gateway.pipeline")


@functools.lru_cache(maxsize=8192)
def feed_topics(item_id: str) -> tuple[str, ...]:
    """Where an item's stage completions go: the operators' topic and its owner's. (Asked
    twice per item and stage, for the same items stage after stage: kept for the recent
    ones.)"""
    return FEED_TOPIC, progress_topic(keys.document_owner(item_id))


_PRIORITY_NAME = {v: k for k, v in PRIORITY_BASE.items()}
_TYPE_NAME = {v: k for k, v in TYPE_BONUS.items()}
# Clocks of Redis (first-seen times) and PostgreSQL (journal times) may differ by this much:
# the margin for journal rows written before they carried their lease's Redis time.
RUN_SKEW_MS = 60_000

# The batch's journal rows and, for the items whose row is new, their feed rows (pending,
# numbered after the commit: one per ``feed_topics``, at most two, in lease order), in one
# statement: one round trip, and PostgreSQL builds the rows' JSON. The feed rows of a topic
# are one pending entry (``payloads``, migration 0023): one insert and, when numbered, one
# delete per topic and batch instead of per item. Items whose
# row already exists were committed by an earlier holder: no feed rows, only acknowledged.
# leased_ms: the Redis time of the FETCH that leased the item (``_new_runs`` tells runs apart
# by it).
_JOURNAL = """
WITH batch AS (
    SELECT * FROM unnest($1::text[], $4::text[], $5::text[], $6::bigint[], $7::text[],
                         $8::text[])
        WITH ORDINALITY AS t(item_id, priority, doc_type, leased_ms, topic1, topic2, ord)
), journaled AS (
    INSERT INTO pipeline_journal (item_id, stage, worker, priority, doc_type, leased_ms)
    SELECT item_id, $2, $3, priority, doc_type, leased_ms FROM batch ORDER BY ord
    ON CONFLICT DO NOTHING RETURNING item_id
), fed AS (
    INSERT INTO feed_pending (topic, kind, payloads)
    SELECT f.topic, $2,
           jsonb_agg(jsonb_build_object('item_id', b.item_id, 'stage', $2::text) ORDER BY b.ord)
    FROM batch AS b JOIN journaled AS j USING (item_id)
    CROSS JOIN LATERAL (VALUES (b.topic1), (b.topic2)) AS f(topic)
    WHERE f.topic IS NOT NULL GROUP BY f.topic ORDER BY min(b.ord), f.topic
)
SELECT item_id FROM journaled
"""


@dataclass(frozen=True)
class WorkerConfig:
    """All timings in seconds (floats, so tests can use short ones)."""

    lease: float = 90
    heartbeat: float = 30
    reclaim_interval: float = 60
    max_reclaims: int = 3
    max_failures: int = 3
    backoff: float = 1.0
    backoff_cap: float = 300.0
    idle_min: float = 0.005
    idle_max: float = 0.25
    shutdown_grace: float = 20.0
    # At most this many items leased and journaled together (group commit); 1 = one
    # transaction per item. The size follows the handler's speed (``batching``): as many
    # as fit in ``batch_seconds``.
    batch: int = 32
    batch_seconds: float = 0.25
    # ... and at most this many bytes of documents (the first item always): what one loop's
    # batch holds in memory stays bounded whatever the documents' sizes.
    batch_bytes: int = 4 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerConfig:
        tuned = positive_numbers(settings.section("pipeline"), _TUNABLE,
                                 "GATEWAY_CONFIG [pipeline]", other=_OTHERS)
        return cls(lease=settings.lease_seconds, heartbeat=settings.heartbeat_seconds,
                   reclaim_interval=settings.reclaim_seconds,
                   max_reclaims=settings.max_reclaims, max_failures=settings.max_failures,
                   backoff=float(tuned.get("backoff_seconds", cls.backoff)),
                   backoff_cap=float(tuned.get("backoff_cap_seconds", cls.backoff_cap)),
                   batch=int(tuned.get("batch", cls.batch)),
                   batch_seconds=float(tuned.get("batch_seconds", cls.batch_seconds)),
                   batch_bytes=int(tuned.get("batch_bytes", cls.batch_bytes)),
                   shutdown_grace=float(tuned.get("shutdown_grace_seconds",
                                                  cls.shutdown_grace)))

    @property
    def lease_ms(self) -> int:
        return max(1, int(self.lease * 1000))


# [pipeline] keys read here; "handlers" is read by gateway.pipeline.handlers, the embed
# stage's keys by gateway.knowledge.
_TUNABLE = {"backoff_seconds": float, "backoff_cap_seconds": float, "batch": int,
            "batch_seconds": float, "batch_bytes": int,
            "shutdown_grace_seconds": float}
_OTHERS = ("handlers", "embedder", "embed_batch", "budget_delay_seconds")


async def run_together(tasks: list[asyncio.Task[None]]) -> None:
    """Wait for all of ``tasks``; when one fails or this is cancelled, cancel and reap the
    rest, so no loop outlives its siblings."""
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _names(lease: queue.LeasedItem) -> tuple[str, str]:
    """A leased item's priority and document type by name."""
    return (_PRIORITY_NAME.get(int(lease.priority_base), "normal"),
            _TYPE_NAME.get(int(lease.bonus), "other"))


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class StageWorker:
    """Runs ``concurrency`` loops for one stage in one process. Each loop leases up to
    ``config.batch`` items at once (as many as the stage's recent time per item fits in
    ``config.batch_seconds``: ``BatchSizer``) and commits their handlers' writes, journal
    rows and feed rows in one transaction (group commit: one fsync for the batch). The
    stages of one process share ``sequencer``, so one numbering pass covers the feed rows
    of all.

    ``feeds`` is the worker of the next stage when this process runs it too (``link``): its
    idle loops are woken by the completions of this one instead of polling (FETCHes that
    find nothing were most of a stage's FETCHes), and wait at most ``idle_max`` for items
    that other processes (or RECLAIM, or a due retry) put in their stage."""

    def __init__(self, runtime: Any, stage: str, handler: Handler, config: WorkerConfig,
                 *, name: str | None = None, sequencer: Sequencer | None = None) -> None:
        self.runtime = runtime
        self.stage = stage
        self.handler = handler
        self.config = config
        self.name = name or worker_id()
        self.sequencer = sequencer or Sequencer(runtime.pg, runtime.cache)
        self.sizer = BatchSizer(config.batch, config.batch_seconds)
        self._handler_seconds = metrics.HANDLER_SECONDS.labels(stage)
        self.feeds: StageWorker | None = None
        self.fed = False  # a worker of this process completes items into this stage
        self._arrived: list[asyncio.Event] = []  # one per loop: ``wake`` sets them

    def link(self, after: StageWorker) -> None:
        """This worker's completions go to ``after``'s stage: wake its loops."""
        self.feeds, after.fed = after, True

    async def run(self, stop: asyncio.Event, concurrency: int) -> None:
        await run_together([asyncio.create_task(self._loop(stop)) for _ in range(concurrency)]
                           + [asyncio.create_task(self._wake_on(stop))])

    def wake(self) -> None:
        """Items arrived in this stage: every idle loop fetches now."""
        for arrived in self._arrived:
            arrived.set()

    async def _wake_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.wake()

    async def _loop(self, stop: asyncio.Event) -> None:
        idle = self.config.idle_min
        # Set by ``wake``; each loop has its own, so no loop clears another's wake-up.
        arrived = asyncio.Event()
        self._arrived.append(arrived)
        maintenance = view_for(self.runtime.durable)
        while not stop.is_set():
            if (await maintenance.current()).on:  # finish what is held, take nothing new
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), REFRESH_SECONDS)
                continue
            arrived.clear()  # arrivals from here on end the wait after an empty FETCH
            try:
                leases = await queue.fetch_many(self.runtime.durable, self.stage, self.name,
                                                self.config.lease_ms, self.sizer.size(),
                                                self.config.batch_bytes)
            except Exception as exc:  # store outage: back off, keep the worker alive
                log.warning("%s: fetch failed: %s", self.stage, exc)
                leases = []
                idle = self.config.idle_max
            if not leases:
                # Fed by this process: its completions wake the loop, so it need not poll.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(),
                                           self.config.idle_max if self.fed else idle)
                idle = min(idle * 2, self.config.idle_max)
                continue
            idle = self.config.idle_min
            try:
                await self.process(leases, stop)
            except StoreOutage as exc:
                log.warning("%s: %s; backing off", self.stage, exc)
                idle = self.config.idle_max
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), idle)
            except Exception as exc:
                # Redis unreachable at COMPLETE/FAIL: the items stay leased and RECLAIM
                # returns them; a journaled stage is then acknowledged without a rerun.
                log.warning("%s: %d item(s) left to RECLAIM: %s", self.stage, len(leases), exc)

    async def process(self, leases: list[queue.LeasedItem],
                      stop: asyncio.Event | None = None) -> None:
        """Handle leased items to their end: completed, failed, or released on shutdown."""
        started = time.perf_counter()
        work = asyncio.create_task(self._run(leases))
        beat = asyncio.create_task(self._heartbeat(leases, work))
        stopper = asyncio.create_task(self._grace(stop, work)) if stop else None
        try:
            errors, written, callbacks = await work
        except asyncio.CancelledError:
            if work.cancelled() and not _current_cancelled():
                await self._release(leases)
                return
            raise
        except Exception as exc:  # the transaction itself failed: nothing committed
            errors = {lease.item_id: exc for lease in leases}
            written, callbacks = set(), []
        finally:
            beat.cancel()
            if stopper:
                stopper.cancel()
        self.sizer.timed(len(leases), time.perf_counter() - started)
        done = [lease for lease in leases if lease.item_id not in errors]
        # Everything below follows a commit that stands, so each step happens whatever the
        # others do; the first Redis error is raised at the end (the loop backs off, and
        # RECLAIM returns what could not be acknowledged).
        redis_errors: list[Exception] = []
        if written:  # numbered before COMPLETE: an acknowledged item's feed row is readable
            await self._sequence(written)
        try:
            await self._complete(done)
        except Exception as exc:
            redis_errors.append(exc)
        outage = [lease for lease in leases if _is_outage(errors.get(lease.item_id))
                  ] if errors else []
        for lease in leases if errors else ():
            if lease.item_id in errors and lease not in outage:
                try:
                    await self._fail(lease, errors[lease.item_id])
                except Exception as exc:
                    redis_errors.append(exc)
        for callback in dict.fromkeys(callbacks):  # registered by several items: runs once
            with contextlib.suppress(Exception):
                await callback()
        if outage:
            # PostgreSQL unreachable is not the item's fault: give the items back untouched
            # (no failure counted) and let the loop back off.
            await self._release(outage)
            raise StoreOutage(f"PostgreSQL unreachable: {errors[outage[0].item_id]}")
        if redis_errors:
            raise redis_errors[0]

    async def _run(self, leases: list[queue.LeasedItem]) -> tuple[
            dict[str, BaseException], set[str], list[Any]]:
        """The handler's ``prepare`` (if any) for the batch, outside any transaction; then
        the whole batch in one transaction; if any handler fails, the batch is rolled back
        and redone one item per transaction (with what ``prepare`` found), so one bad item
        holds back no other."""
        batch = [(lease, StageContext(lease.item_id, self.stage, priority, doc_type,
                                      lease.document, NO_CONNECTION, self.runtime))
                 for lease, (priority, doc_type) in zip(leases, map(_names, leases),
                                                        strict=True)]
        try:
            prepared_seconds = await self._prepare([ctx for _, ctx in batch])
        except Exception as exc:
            return dict.fromkeys((lease.item_id for lease in leases), exc), set(), []
        try:
            written, callbacks = await self._transaction(batch, prepared_seconds)
            return {}, written, callbacks
        except Exception as exc:
            if len(leases) == 1 or _is_outage(exc):  # a store outage fails every item alike
                return dict.fromkeys((lease.item_id for lease in leases), exc), set(), []
            log.info("%s: batch of %d rolled back (%s: %s); one item per transaction",
                     self.stage, len(leases), type(exc).__name__, exc)
        errors: dict[str, BaseException] = {}
        written, callbacks = set(), []
        for one in batch:
            try:
                one_written, one_callbacks = await self._transaction([one], prepared_seconds)
            except Exception as exc:
                errors[one[0].item_id] = exc
                continue
            written |= one_written
            callbacks += one_callbacks
        return errors, written, callbacks

    async def _prepare(self, contexts: list[StageContext]) -> float:
        """The handler's ``prepare``, before the transaction and with no connection held
        (a model call must not keep a transaction open); its seconds per item."""
        prepare = getattr(self.handler, "prepare", None)
        if prepare is None:
            return 0.0
        started = time.perf_counter()
        try:
            await prepare(contexts)
        except Exception as exc:
            if _is_outage(exc):  # PostgreSQL unreachable for its reads: not the items' fault
                raise
            raise HandlerFailed(exc) from exc
        return (time.perf_counter() - started) / len(contexts)

    async def _transaction(self, batch: list[tuple[queue.LeasedItem, StageContext]],
                           prepared_seconds: float = 0.0) -> tuple[set[str], list[Any]]:
        callbacks: list[Any] = []
        async with self.runtime.pg.acquire() as conn, conn.transaction():
            if isinstance(conn, GatewayConnection):  # nothing runs after the COMMIT
                conn.reset_at_commit()
            fresh = await self._journal(conn, batch)
            if self.stage == STAGES[0] and len(fresh) < len(batch):
                fresh |= await self._new_runs(conn, [(lease, ctx) for lease, ctx in batch
                                                     if lease.item_id not in fresh])
            contexts = [ctx for lease, ctx in batch if lease.item_id in fresh]
            for ctx in contexts:  # a redo starts from what prepare left, nothing else
                ctx.conn, ctx.after_commit = conn, []
            await self._handle(contexts, prepared_seconds)
            for ctx in contexts:
                callbacks += ctx.after_commit
            if self.stage == STAGES[0]:  # a stored webhook shows on webhook:<source> too
                callbacks += await webhook_rows.append(
                    conn, ((ctx.item_id, ctx.document) for ctx in contexts), self.sequencer)
        written = {topic for ctx in contexts for topic in feed_topics(ctx.item_id)}
        return written, callbacks

    async def _journal(self, conn: asyncpg.Connection,
                       batch: list[tuple[queue.LeasedItem, StageContext]]) -> set[str]:
        """Journal rows for ``batch`` and the feed rows of each new one (``_JOURNAL``);
        returns the items whose rows are new. Nothing shared is locked by the feed rows, so
        the loops and processes of every stage commit side by side."""
        topics = [(*feed_topics(lease.item_id), None)[:2] for lease, _ in batch]
        for topic in {topic for pair in topics for topic in pair if topic is not None}:
            check_topic(topic)
        check_row(self.stage, {})
        return {r["item_id"] for r in await conn.fetch(
            _JOURNAL, [lease.item_id for lease, _ in batch], self.stage, self.name,
            [ctx.priority for _, ctx in batch], [ctx.doc_type for _, ctx in batch],
            [lease.started_ms for lease, _ in batch], [pair[0] for pair in topics],
            [pair[1] for pair in topics])}

    async def _handle(self, contexts: list[StageContext], prepared_seconds: float) -> None:
        """Each item's handler in turn, or all at once through its ``many``."""
        many = getattr(self.handler, "many", None)
        groups = [contexts] if many is not None and len(contexts) > 1 else [
            [ctx] for ctx in contexts]
        for group in groups:
            started = time.perf_counter()
            try:
                if many is not None and len(group) > 1:
                    await many(group)
                else:
                    await self.handler(group[0])
            except Exception as exc:
                raise HandlerFailed(exc) from exc
            elapsed = (time.perf_counter() - started) / len(group) + prepared_seconds
            for _ in group:
                self._handler_seconds.observe(elapsed)

    async def _sequence(self, topics: set[str]) -> None:
        """Number and signal the committed feed rows of ``topics`` (with whatever other
        loops committed meanwhile): one pass per family (``pipeline`` numbers its
        ``pipeline:<owner>`` topics with it). A failure only delays them: they stay pending
        for the next pass or the sweep, and the commit stands, so the items are still
        acknowledged."""
        roots = [t for t in sorted(topics) if not any(t.startswith(r + ":") for r in topics)]
        for failed in await asyncio.gather(*map(self.sequencer.number, roots),
                                           return_exceptions=True):
            if isinstance(failed, BaseException):
                log.warning("%s: feed rows left pending for the sweep: %s", self.stage,
                            failed)

    async def _new_runs(self, conn: asyncpg.Connection,
                        held: list[tuple[queue.LeasedItem, StageContext]]) -> set[str]:
        """Of the first stage's items whose journal rows exist, those accepted again after
        their dedup window: their rows are an earlier run's, leased before this run was first
        seen (both Redis times, so exact whatever the window), so they are dropped and the
        stages run again. Rows leased after this run's first-seen time are a redo of this run
        (a holder committed, then died) and are only acknowledged. Rows from before the
        journal kept lease times are judged by ``completed_at`` with a margin for skew."""
        ids = [lease.item_id for lease, _ in held]
        seen = await asyncio.gather(*(self.runtime.durable.hget(
            seen_key(lease.item_id, lease.tag), lease.item_id) for lease, _ in held))
        rows = await conn.fetch(
            "SELECT item_id, max(leased_ms) AS leased, count(*) - count(leased_ms) AS untimed,"
            " extract(epoch FROM max(completed_at)) * 1000 AS at"
            " FROM pipeline_journal WHERE item_id = ANY($1::text[]) GROUP BY item_id", ids)
        journal = {r["item_id"]: r for r in rows}
        earlier = [(lease, ctx) for (lease, ctx), first in zip(held, seen, strict=True)
                   if first is not None and lease.item_id in journal
                   and _before_run(journal[lease.item_id], int(first))]
        if not earlier:
            return set()
        stale = [lease.item_id for lease, _ in earlier]
        log.info("%s: %d item(s) accepted again after their dedup window: stages run anew",
                 self.stage, len(stale))
        await conn.execute("DELETE FROM pipeline_journal WHERE item_id = ANY($1::text[])", stale)
        return await self._journal(conn, earlier)

    async def _complete(self, leases: list[queue.LeasedItem]) -> None:
        if not leases:
            return
        results = await queue.complete_many(self.runtime.durable, leases)
        after = next_stage(self.stage)
        ok = 0
        for lease, result in zip(leases, results, strict=True):
            if result is queue.LeaseResult.OK:
                ok += 1
            else:
                log.warning("%s %s: completion refused (%s): lease lost; the journal holds it",
                            self.stage, lease.item_id, result.name)
        metrics.COMPLETED.labels(self.stage).inc(ok)
        if after and ok:
            metrics.ENQUEUED.labels(after).inc(ok)
            if self.feeds is not None:
                self.feeds.wake()

    async def _heartbeat(self, leases: list[queue.LeasedItem], work: asyncio.Task[Any]) -> None:
        """Extend the leases every heartbeat; when every lease is lost, stop the work."""
        held = list(leases)
        while held:
            await asyncio.sleep(self.config.heartbeat)
            try:  # the batch in one call
                results = await queue.heartbeat_many(self.runtime.durable, held,
                                                     self.config.lease_ms)
            except Exception as exc:
                log.warning("%s: heartbeat of %d item(s) failed: %s", self.stage, len(held),
                            exc)
                continue
            kept = []
            for lease, result in zip(held, results, strict=True):
                if result is queue.LeaseResult.OK:
                    kept.append(lease)
                else:
                    log.warning("%s %s: lease lost (%s)", self.stage, lease.item_id,
                                result.name)
            held = kept
        work.cancel()  # a zombie: nothing it commits would be acknowledged

    async def _grace(self, stop: asyncio.Event, work: asyncio.Task[Any]) -> None:
        """On stop, give in-flight items ``shutdown_grace`` seconds, then cancel them (they
        are then released: rolled back in PostgreSQL, back in their queue in Redis)."""
        await stop.wait()
        await asyncio.sleep(self.config.shutdown_grace)
        work.cancel()

    async def _release(self, leases: list[queue.LeasedItem]) -> None:
        with contextlib.suppress(Exception):  # what is not released, RECLAIM returns
            await queue.release_many(self.runtime.durable, leases)

    async def _fail(self, lease: queue.LeasedItem, exc: BaseException) -> None:
        if isinstance(exc, HandlerFailed):
            exc = exc.cause
        if isinstance(exc, Deferred):
            log.info("%s %s delayed %.0f s: %s", self.stage, lease.item_id, exc.seconds, exc)
            metrics.DELAYED.labels(self.stage).inc()
            await queue.delay(self.runtime.durable, lease, int(exc.seconds * 1000))
            return
        dead = isinstance(exc, PermanentError)
        reason = f"{'permanent: ' if dead else ''}{type(exc).__name__}: {exc}"
        log.info("%s %s failed: %s", self.stage, lease.item_id, reason)
        metrics.FAILED.labels(self.stage).inc()
        outcome = await queue.fail(
            self.runtime.durable, lease, reason,
            max_failures=1 if dead else self.config.max_failures,
            backoff_ms=int(self.config.backoff * 1000),
            backoff_cap_ms=int(self.config.backoff_cap * 1000))
        if outcome.dead:
            metrics.DEAD_LETTERED.labels(self.stage).inc()


class HandlerFailed(Exception):
    """The stage handler raised (as opposed to the worker's own store calls)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class StoreOutage(Exception):
    """A store failed under the whole batch; the items were released."""


_OUTAGE_ERRORS = (OSError, TimeoutError, asyncpg.PostgresConnectionError,
                  asyncpg.InterfaceError, asyncpg.CannotConnectNowError)


def _before_run(journal: Any, first_seen_ms: int) -> bool:
    """Every journal row of the item is older than its run first seen at ``first_seen_ms``:
    by lease time when each row has one, else by completion time with ``RUN_SKEW_MS``."""
    if journal["leased"] is not None and int(journal["leased"]) >= first_seen_ms:
        return False
    if not journal["untimed"]:
        return True
    return float(journal["at"]) < first_seen_ms - RUN_SKEW_MS


def _is_outage(exc: BaseException | None) -> bool:
    """A store error outside the handler; errors raised by handlers always count."""
    return isinstance(exc, _OUTAGE_ERRORS)


def _current_cancelled() -> bool:
    task = asyncio.current_task()
    return bool(task and task.cancelling())
