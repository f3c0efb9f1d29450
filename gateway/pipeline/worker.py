"""Pipeline workers: fetch an item, heartbeat while its handler runs, journal + complete, or
fail; on stop, finish in-flight items (or release them after a grace period).

Ordering per item: handler results, the journal row and the feed row commit in one
PostgreSQL transaction; only then COMPLETE acknowledges in Redis, and the feed signal is
published. A crash between the commit and COMPLETE leaves the item leased; RECLAIM returns
it, the next worker finds its journal row and acknowledges without running the handler
again, so each stage's effects happen once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config import Settings
from gateway.pipeline import metrics, queue
from gateway.pipeline.handlers import Handler, PermanentError, StageContext
from gateway.pipeline.stages import PRIORITY_BASE, TYPE_BONUS, next_stage
from gateway.push import feed

log = logging.getLogger("gateway.pipeline")

FEED_TOPIC = "pipeline"
_PRIORITY_NAME = {v: k for k, v in PRIORITY_BASE.items()}
_TYPE_NAME = {v: k for k, v in TYPE_BONUS.items()}


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

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerConfig:
        section: Mapping[str, Any] = settings.section("pipeline")
        return cls(lease=settings.lease_seconds, heartbeat=settings.heartbeat_seconds,
                   reclaim_interval=settings.reclaim_seconds,
                   max_reclaims=settings.max_reclaims, max_failures=settings.max_failures,
                   backoff=float(section.get("backoff_seconds", 1.0)),
                   backoff_cap=float(section.get("backoff_cap_seconds", 300.0)))

    @property
    def lease_ms(self) -> int:
        return max(1, int(self.lease * 1000))


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class StageWorker:
    """Runs ``concurrency`` loops for one stage in one process."""

    def __init__(self, runtime: Any, stage: str, handler: Handler, config: WorkerConfig,
                 *, name: str | None = None) -> None:
        self.runtime = runtime
        self.stage = stage
        self.handler = handler
        self.config = config
        self.name = name or worker_id()

    async def run(self, stop: asyncio.Event, concurrency: int) -> None:
        loops = [asyncio.create_task(self._loop(stop)) for _ in range(concurrency)]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def _loop(self, stop: asyncio.Event) -> None:
        idle = self.config.idle_min
        while not stop.is_set():
            try:
                lease = await queue.fetch(self.runtime.durable, self.stage, self.name,
                                          self.config.lease_ms)
            except Exception as exc:  # store outage: back off, keep the worker alive
                log.warning("%s: fetch failed: %s", self.stage, exc)
                lease = None
                idle = self.config.idle_max
            if lease is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), idle)
                idle = min(idle * 2, self.config.idle_max)
                continue
            idle = self.config.idle_min
            try:
                await self.process(lease, stop)
            except Exception as exc:
                # Redis unreachable at COMPLETE/FAIL: the item stays leased and RECLAIM
                # returns it; a journaled stage is then acknowledged without a rerun.
                log.warning("%s %s: left to RECLAIM: %s", self.stage, lease.item_id, exc)

    async def process(self, lease: queue.Lease, stop: asyncio.Event | None = None) -> None:
        """Handle one leased item to its end: completed, failed, or released on shutdown."""
        work = asyncio.create_task(self._run(lease))
        beat = asyncio.create_task(self._heartbeat(lease, work))
        stopper = asyncio.create_task(self._grace(stop, work)) if stop else None
        try:
            row, callbacks = await work
        except asyncio.CancelledError:
            if work.cancelled() and not _current_cancelled():
                await self._release(lease)
                return
            raise
        except PermanentError as exc:
            await self._fail(lease, f"permanent: {exc}", dead=True)
            return
        except Exception as exc:
            await self._fail(lease, f"{type(exc).__name__}: {exc}")
            return
        finally:
            beat.cancel()
            if stopper:
                stopper.cancel()
        result = await queue.complete(self.runtime.durable, lease)
        if result is not queue.LeaseResult.OK:
            log.warning("%s %s: completion refused (%s): lease lost, journal already holds it",
                        self.stage, lease.item_id, result.name)
        metrics.COMPLETED.labels(self.stage).inc()
        next_ = next_stage(self.stage)
        if next_ and result is queue.LeaseResult.OK:
            metrics.ENQUEUED.labels(next_).inc()
        if row is not None:
            await feed.publish(self.runtime.cache, row)
        for callback in callbacks:
            with contextlib.suppress(Exception):
                await callback()

    async def _run(self, lease: queue.Lease) -> tuple[feed.FeedRow | None, list[Any]]:
        priority = _PRIORITY_NAME.get(int(lease.base), "normal")
        doc_type = _TYPE_NAME.get(int(lease.bonus), "other")
        async with self.runtime.pg.acquire() as conn, conn.transaction():
            first = await conn.fetchval(
                "INSERT INTO pipeline_journal (item_id, stage, worker, priority, doc_type)"
                " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING true",
                lease.item_id, self.stage, self.name, priority, doc_type)
            if not first:  # an earlier holder committed this stage; just acknowledge
                return None, []
            ctx = StageContext(lease.item_id, self.stage, priority, doc_type, lease.document,
                               conn, self.runtime)
            started = time.perf_counter()
            await self.handler(ctx)
            metrics.HANDLER_SECONDS.labels(self.stage).observe(time.perf_counter() - started)
            row = await feed.append(conn, FEED_TOPIC, self.stage,
                                    {"item_id": lease.item_id, "stage": self.stage})
        return row, ctx.after_commit

    async def _heartbeat(self, lease: queue.Lease, work: asyncio.Task[Any]) -> None:
        """Extend the lease every heartbeat; a lost lease stops the handler (zombie)."""
        while True:
            await asyncio.sleep(self.config.heartbeat)
            try:
                result = await queue.heartbeat(self.runtime.durable, lease,
                                               self.config.lease_ms)
            except Exception as exc:
                log.warning("%s %s: heartbeat failed: %s", self.stage, lease.item_id, exc)
                continue
            if result is not queue.LeaseResult.OK:
                log.warning("%s %s: lease lost (%s); abandoning", self.stage, lease.item_id,
                            result.name)
                work.cancel()
                return

    async def _grace(self, stop: asyncio.Event, work: asyncio.Task[Any]) -> None:
        """On stop, give the in-flight item ``shutdown_grace`` seconds, then cancel it (it is
        then released: rolled back in PostgreSQL, back in its queue in Redis)."""
        await stop.wait()
        await asyncio.sleep(self.config.shutdown_grace)
        work.cancel()

    async def _release(self, lease: queue.Lease) -> None:
        with contextlib.suppress(Exception):
            await queue.release(self.runtime.durable, lease)

    async def _fail(self, lease: queue.Lease, reason: str, *, dead: bool = False) -> None:
        log.info("%s %s failed: %s", self.stage, lease.item_id, reason)
        metrics.FAILED.labels(self.stage).inc()
        outcome = await queue.fail(
            self.runtime.durable, lease, reason,
            max_failures=1 if dead else self.config.max_failures,
            backoff_ms=int(self.config.backoff * 1000),
            backoff_cap_ms=int(self.config.backoff_cap * 1000))
        if outcome.dead:
            metrics.DEAD_LETTERED.labels(self.stage).inc()


def _current_cancelled() -> bool:
    task = asyncio.current_task()
    return bool(task and task.cancelling())
