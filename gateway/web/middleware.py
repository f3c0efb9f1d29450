"""The middleware every route gets: size limit before the body is read, JSON errors, metrics."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.metrics import HTTP_LATENCY, HTTP_REQUESTS
from gateway.web.errors import ApiError, json_error, store_error

log = logging.getLogger("gateway.web")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _route_name(request: web.Request) -> str:
    route = request.match_info.route
    resource = route.resource
    return resource.canonical if resource is not None else "unmatched"


@functools.lru_cache(maxsize=4096)
def _children(route: str, status: int) -> tuple[Any, Any]:
    """Prometheus label lookups cost a few µs each; routes times statuses is a small set."""
    return HTTP_REQUESTS.labels(route, str(status)), HTTP_LATENCY.labels(route)


def _observe(route: str, status: int, seconds: float) -> None:
    requests, latency = _children(route, status)
    requests.inc()
    latency.observe(seconds)


def make_middleware(max_bytes: int) -> Middleware:
    """One middleware, not a chain: each layer costs every request (the ingest path) a wrapper
    call and a coroutine."""

    @web.middleware
    async def gateway_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        route = _route_name(request)
        length = request.content_length
        try:
            if length is not None and length > max_bytes:
                # Refuse on the declared length, before a byte of the body is read.
                raise ApiError(413, "payload_too_large",
                               f"body of {length} bytes is over the limit of {max_bytes}",
                               {"Connection": "close"})
            response = await handler(request)
        except Exception as exc:
            response = _error_response(exc, route)
        _observe(route, response.status, time.perf_counter() - started)
        return response

    return gateway_middleware


def _error_response(exc: Exception, route: str) -> web.StreamResponse:
    """The JSON error every failure maps to (redirects and other non-errors go up as is)."""
    if isinstance(exc, ApiError):
        return json_error(exc.status, exc.code, exc.detail, exc.headers)
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        detail = exc.text if exc.text and not exc.text.startswith(str(exc.status)) else exc.reason
        return json_error(exc.status, None, detail or exc.reason,
                          {k: v for k, v in exc.headers.items()
                           if k.lower() in ("allow", "retry-after")})
    if isinstance(exc, (asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
                        asyncpg.InterfaceError, ConnectionError)):
        log.warning("postgres unavailable on %s: %s", route, type(exc).__name__)
        return json_error(503, "store_unavailable", "the database is unreachable; retry later",
                          {"Retry-After": "5"})
    mapped = store_error(exc)
    if mapped is None:
        log.exception("unhandled error on %s", route, exc_info=exc)
        return json_error(500, "internal_error", "unexpected error; see server log")
    log.warning("store refused on %s: %s", route, type(exc).__name__)
    return json_error(mapped.status, mapped.code, mapped.detail, mapped.headers)
