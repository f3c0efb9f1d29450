"""What components share on the aiohttp application: the open stores (``RUNTIME``) and the
readiness registry that ``/readyz`` reports."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.stores.runtime import Runtime

# A readiness check answers (ok, detail); ``required`` checks make /readyz answer 503.
ReadinessCheck = Callable[[], Awaitable[tuple[bool, str]]]

RUNTIME: web.AppKey[Runtime] = web.AppKey("runtime", Runtime)
READINESS: web.AppKey[dict[str, tuple[ReadinessCheck, bool]]] = web.AppKey("readiness", dict)


def add_readiness_check(app: web.Application, name: str, check: ReadinessCheck,
                        *, required: bool = True) -> None:
    """Register a check for ``/readyz``; a failing ``required`` one makes it answer 503."""
    if READINESS not in app:
        app[READINESS] = {}
    app[READINESS][name] = (check, required)
