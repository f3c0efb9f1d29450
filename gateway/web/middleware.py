"""Middlewares every route gets: size limit before the body is read, JSON errors, metrics."""

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


def make_size_limit(max_bytes: int) -> Middleware:
    @web.middleware
    async def size_limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        length = request.content_length
        if length is not None and length > max_bytes:
            # Refuse on the declared length, before a byte of the body is read.
            return json_error(413, "payload_too_large",
                              f"body of {length} bytes is over the limit of {max_bytes}",
                              {"Connection": "close"})
        return await handler(request)

    return size_limit


@functools.lru_cache(maxsize=4096)
def _children(route: str, status: int) -> tuple[Any, Any]:
    """Prometheus label lookups cost a few µs each; routes times statuses is a small set."""
    return HTTP_REQUESTS.labels(route, str(status)), HTTP_LATENCY.labels(route)


def _observe(route: str, status: int, seconds: float) -> None:
    requests, latency = _children(route, status)
    requests.inc()
    latency.observe(seconds)


@web.middleware
async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    route = _route_name(request)
    try:
        response = await handler(request)
    except ApiError as exc:
        response = json_error(exc.status, exc.code, exc.detail, exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        detail = exc.text if exc.text and not exc.text.startswith(str(exc.status)) else exc.reason
        response = json_error(exc.status, None, detail or exc.reason,
                              {k: v for k, v in exc.headers.items()
                               if k.lower() in ("allow", "retry-after")})
    except (asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
            asyncpg.InterfaceError, ConnectionError) as exc:
        log.warning("postgres unavailable on %s: %s", route, type(exc).__name__)
        response = json_error(503, "store_unavailable", "the database is unreachable; retry later",
                              {"Retry-After": "5"})
    except Exception as exc:
        mapped = store_error(exc)
        if mapped is None:
            log.exception("unhandled error on %s", route)
            response = json_error(500, "internal_error", "unexpected error; see server log")
        else:
            log.warning("store refused on %s: %s", route, type(exc).__name__)
            response = json_error(mapped.status, mapped.code, mapped.detail, mapped.headers)
    _observe(route, response.status, time.perf_counter() - started)
    return response
