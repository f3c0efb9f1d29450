"""Admin bearer-token check for ``/v1/admin/...``, reusable by any component.

The comparison is constant-time over SHA-256 digests, so neither the token's content nor its
length leaks through timing. Without ``GATEWAY_ADMIN_TOKEN`` the admin API is closed.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.api.errors import ApiError
from gateway.api.state import RUNTIME

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="gateway-admin"'}


def _digest(value: str) -> bytes:
    # aiohttp hands header bytes that are not UTF-8 over as surrogates: hash the bytes sent.
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def require_admin(request: web.Request) -> None:
    """Raise a 401 ``ApiError`` unless the request carries the admin bearer token."""
    expected = request.app[RUNTIME].settings.admin_token
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    if not expected:
        raise ApiError(401, "unauthorized", "admin API disabled: GATEWAY_ADMIN_TOKEN is not set",
                       _CHALLENGE)
    if scheme.lower() != "bearer" or not presented.strip():
        raise ApiError(401, "unauthorized", "missing bearer token", _CHALLENGE)
    if not hmac.compare_digest(_digest(presented.strip()), _digest(expected.get())):
        raise ApiError(401, "unauthorized", "wrong admin token", _CHALLENGE)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def admin_only(handler: Handler) -> Handler:
    """Decorator form of :func:`require_admin` for route handlers."""
    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        require_admin(request)
        return await handler(request)
    return wrapped
