"""``gateway serve``: topology checks, then the HTTP app (and, for ``gateway dev``, workers)
until SIGINT/SIGTERM, then a graceful stop: ``/readyz`` answers 503 from that instant (a
balancer polling on a kept-alive connection stops sending), the listening socket closes, SSE
streams end with ``gateway.disconnect`` (reason ``shutdown``), requests in flight finish
(at most ``SHUTDOWN_SECONDS``), the inbox consumers finish the entry in hand and give their
chats back, background services stop, connections close. ``--processes N`` runs N of
them on one port under ``gateway.app.supervisor``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
from collections.abc import Callable, Sequence

from aiohttp import web

from gateway.api.state import add_readiness_check
from gateway.app import loop
from gateway.app.process import Service, install_stop_signals, preflight
from gateway.app.worker import reclaim_service
from gateway.config import ConfigError, Settings
from gateway.stores.runtime import open_runtime
from gateway.web import connections
from gateway.web.app import create_app

log = logging.getLogger("gateway.serve")
SHUTDOWN_SECONDS = 10.0


async def run(settings: Settings, *, services: Sequence[Service] = (),
              stop: asyncio.Event | None = None,
              on_ready: Callable[[str], None] | None = None,
              reuse_port: bool = False) -> int:
    stop = stop or asyncio.Event()
    install_stop_signals(stop)
    if not await preflight(settings):
        return 1
    runtime = await open_runtime(settings)
    app = create_app(runtime)

    async def not_stopping() -> tuple[bool, str]:
        return (False, "stopping") if stop.is_set() else (True, "running")

    add_readiness_check(app, "stopping", not_stopping)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_SECONDS,
                           **connections.runner_options(settings))
    tasks: list[asyncio.Task[None]] = []
    listening = False
    try:
        await runner.setup()
        # reuse_port: several processes listen on the port, the kernel spreads connections.
        site = connections.gated_site(runner, app, settings, reuse_port=reuse_port or None)
        try:
            await site.start()
        except OSError as exc:  # an operator's mistake: one line, not a traceback
            raise ConfigError("GATEWAY_PORT", f"cannot listen on {settings.host}:"
                              f"{settings.port}: {os.strerror(exc.errno) if exc.errno else exc}"
                              ) from None
        listening = True
        url = f"http://{settings.host}:{_bound_port(runner, settings.port)}"
        log.info("serving on %s", url)
        # What exists now (modules, the app, pools) lives as long as the process: keep it out
        # of the cyclic collector's full passes, which otherwise walk it again and again.
        gc.freeze()
        tasks = [asyncio.create_task(service(runtime, stop)) for service in services]
        if on_ready:
            on_ready(url)
        await _wait_stop(stop, tasks)
    finally:
        stop.set()
        if listening:
            log.info("stopping: not ready, closing the socket, finishing requests in flight")
        await runner.cleanup()
        for task in tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
        await runtime.close()
    return 0


async def _wait_stop(stop: asyncio.Event, tasks: list[asyncio.Task[None]]) -> None:
    """Return on a stop request, or when a background service dies (then re-raise its error)."""
    waiter = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not waiter and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        waiter.cancel()


def _bound_port(runner: web.AppRunner, default: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return default


def main(args: argparse.Namespace, settings: Settings) -> int:
    changes: dict[str, object] = {"telegram_polling": bool(args.telegram_polling)}
    if args.host:
        changes["host"] = args.host
    if args.port is not None:
        changes["port"] = args.port
    settings = dataclasses.replace(settings, **changes)  # type: ignore[arg-type]
    if args.processes < 1:
        raise SystemExit("gateway serve: --processes must be >= 1")
    if args.processes > 1:
        from gateway.app import supervisor
        return supervisor.run(settings.host, settings.port, args.processes,
                              telegram_polling=settings.telegram_polling)
    on_ready = _tell_supervisor(args.ready_fd) if args.ready_fd is not None else None
    return loop.run(run(settings, services=[reclaim_service()], on_ready=on_ready,
                        reuse_port=args.reuse_port))


def _tell_supervisor(fd: int) -> Callable[[str], None]:
    """One byte on the supervisor's pipe once the process listens: from then on an exit is
    a failure to replace, not a failure to start."""
    def ready(url: str) -> None:
        with contextlib.suppress(OSError):
            os.write(fd, b"1")
            os.close(fd)
    return ready
