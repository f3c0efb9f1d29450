"""What every long-running command shares: the background-service shape, the stop signals,
and the topology check that refuses to start on a failure."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.config import Settings
from gateway.providers.config import provider_checks
from gateway.stores import doctor
from gateway.stores.runtime import Runtime

log = logging.getLogger("gateway.serve")

# A background service runs until the event is set, then returns after finishing its work.
Service = Callable[[Runtime, asyncio.Event], Coroutine[Any, Any, None]]


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)


async def preflight(settings: Settings) -> bool:
    """Refuse to serve when the topology check fails (a durable instance that can evict) or
    a ``[providers.*]`` table cannot be used (its key's variable unset)."""
    checks = await doctor.run_checks(settings) + provider_checks(settings)
    failed = [check for check in checks if check.status == "fail"]
    if failed:  # one line: the first failure, and how to see the others
        more = (f" (and {len(failed) - 1} more: `gateway doctor` lists them)"
                if len(failed) > 1 else "")
        print(f"gateway: refusing to start: {failed[0].line()}{more}", file=sys.stderr)
        return False
    for check in checks:
        if check.status == "warn":
            log.warning("%s", check.line())
    return True
