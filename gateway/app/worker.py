"""``gateway worker`` and the workers ``gateway dev`` runs in-process: one ``StageWorker``
per stage plus the periodic RECLAIM and the feed sweep, until the stop event (SIGTERM/SIGINT)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence

from gateway.app import loop
from gateway.app.process import Service, install_stop_signals
from gateway.config import Settings
from gateway.knowledge import embedders
from gateway.knowledge.stages import DEFAULTS
from gateway.pipeline import queue
from gateway.pipeline.handlers import Handler, load_handlers
from gateway.pipeline.stages import STAGES, next_stage
from gateway.pipeline.status import refresh_depth_gauges
from gateway.pipeline.worker import StageWorker, WorkerConfig, run_together
from gateway.push.sequencer import Sequencer
from gateway.stores.runtime import Runtime, open_runtime

log = logging.getLogger("gateway.pipeline")


async def reclaim_loop(runtime: Runtime, stop: asyncio.Event, config: WorkerConfig) -> None:
    """RECLAIM every ``reclaim_interval`` (atomic per item, so several processes may run it
    at once); also refresh the queue-depth gauges."""
    while not stop.is_set():
        try:
            totals = await queue.reclaim_all(runtime.durable, max_reclaims=config.max_reclaims)
            for stage, (back, dead) in totals.items():
                if back or dead:
                    log.warning("reclaimed %d and dead-lettered %d expired leases in %s",
                                back, dead, stage)
            await refresh_depth_gauges(runtime.durable)
        except Exception as exc:
            log.warning("reclaim pass failed: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), config.reclaim_interval)


async def run_workers(runtime: Runtime, stop: asyncio.Event, *,
                      stages: Sequence[str] = STAGES, concurrency: int = 8,
                      config: WorkerConfig | None = None,
                      handlers: dict[str, Handler] | None = None) -> None:
    config = config or WorkerConfig.from_settings(runtime.settings)
    handlers = handlers or load_handlers(runtime.settings.section("pipeline"), DEFAULTS)
    if "embed" in stages:  # a wrong [pipeline] embedder stops the start, not every item
        warm = getattr(embedders.for_runtime(runtime), "warm", None)
        if warm is not None:  # the local model loads before the first lease, not during it
            await warm()
    # Said once the model is loaded: from here the process leases work (a supervisor or a
    # benchmark waiting for "ready" sees no start-up cost after it).
    log.info("worker: stages %s, concurrency %d: ready", ",".join(stages), concurrency)
    sequencer = Sequencer(runtime.pg, runtime.cache)  # one numbering pass for every stage
    workers = {stage: StageWorker(runtime, stage, handlers[stage], config, sequencer=sequencer)
               for stage in stages}
    for stage, worker in workers.items():  # completions wake the next stage's idle loops
        after = next_stage(stage)
        if after in workers:
            worker.link(workers[after])
    tasks = [asyncio.create_task(worker.run(stop, concurrency)) for worker in workers.values()]
    tasks.append(asyncio.create_task(reclaim_loop(runtime, stop, config)))
    tasks.append(asyncio.create_task(sequencer.run_sweeper(stop)))
    await run_together(tasks)


def service(concurrency: int = 8, stages: Sequence[str] = STAGES) -> Service:
    """A ``serve.Service`` running workers for ``stages`` plus RECLAIM."""
    async def run(runtime: Runtime, stop: asyncio.Event) -> None:
        await run_workers(runtime, stop, stages=stages, concurrency=concurrency)
    return run


def reclaim_service() -> Service:
    """RECLAIM (and the depth gauges) alone: every ``gateway serve`` replica runs it, so
    expired leases come back even when no worker is alive to notice."""
    async def run(runtime: Runtime, stop: asyncio.Event) -> None:
        await reclaim_loop(runtime, stop, WorkerConfig.from_settings(runtime.settings))
    return run


async def _main(settings: Settings, stages: Sequence[str], concurrency: int) -> int:
    handlers = load_handlers(settings.section("pipeline"), DEFAULTS)
    stop = asyncio.Event()
    install_stop_signals(stop)
    runtime = await open_runtime(settings, pg_max_size=min(len(stages) * concurrency, 40) + 2)
    try:
        await run_workers(runtime, stop, stages=stages, concurrency=concurrency,
                          handlers=handlers)
    finally:
        await runtime.close()
    return 0


def main(args: argparse.Namespace, settings: Settings) -> int:
    if args.concurrency < 1:
        raise SystemExit("gateway worker: --concurrency must be >= 1")
    try:
        load_handlers(settings.section("pipeline"), DEFAULTS)
    except ValueError as exc:
        print(f"gateway worker: configuration error: [pipeline.handlers]: {exc}",
              file=sys.stderr)
        return 2
    return loop.run(_main(settings, list(args.stages), args.concurrency))
