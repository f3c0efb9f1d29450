"""JSON errors ``{"error": code, "detail": text}`` for every 4xx/5xx answer."""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

# How long a sender should wait before retrying when a store refuses or is unreachable.
RETRY_AFTER_SECONDS = 5

_CODES = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 409: "conflict", 413: "payload_too_large",
    415: "unsupported_media_type", 422: "unprocessable", 429: "rate_limited",
    500: "internal_error", 502: "bad_gateway", 503: "unavailable", 504: "timeout",
}


class ApiError(Exception):
    """Raise from a handler to answer with a JSON error; the route guard
    (``gateway.api.routes``) renders it."""

    def __init__(self, status: int, code: str, detail: str,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = dict(headers or {})


# A detail may quote the request (an unknown id, a bad value): never more than this of it.
MAX_DETAIL = 1000


def json_error(status: int, code: str | None, detail: str,
               headers: Mapping[str, str] | None = None) -> web.Response:
    if len(detail) > MAX_DETAIL:
        detail = detail[:MAX_DETAIL] + "…"
    return web.Response(
        status=status,
        text=json.dumps({"error": code or _CODES.get(status, "error"), "detail": detail}),
        content_type="application/json",
        headers=headers,
    )


def backpressure(detail: str) -> ApiError:
    return ApiError(503, "backpressure", detail, {"Retry-After": str(RETRY_AFTER_SECONDS)})


def store_error(exc: Exception) -> ApiError | None:
    """Map a Redis failure to its answer (503 + Retry-After), or None if it is not one."""
    # redis-py strips the "OOM" prefix when it raises OutOfMemoryError.
    if isinstance(exc, OutOfMemoryError) or (
            isinstance(exc, ResponseError) and str(exc).startswith("OOM")):
        return backpressure("redis-durable is at maxmemory; retry later")
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError):
        return ApiError(503, "store_unavailable", "a store is unreachable; retry later",
                        {"Retry-After": str(RETRY_AFTER_SECONDS)})
    return None

