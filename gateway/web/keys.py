"""Typed keys for objects stored on the aiohttp application."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.runtime import Runtime

# A readiness check answers (ok, detail); ``required`` checks make /readyz answer 503.
ReadinessCheck = Callable[[], Awaitable[tuple[bool, str]]]

RUNTIME: web.AppKey[Runtime] = web.AppKey("runtime", Runtime)
READINESS: web.AppKey[dict[str, tuple[ReadinessCheck, bool]]] = web.AppKey("readiness", dict)
