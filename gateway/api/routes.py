"""Route registration: every handler is wrapped once, at registration, with what every route
gets — the size limit before the body is read, JSON errors, request metrics.

This is the job of an aiohttp middleware, done without one: any middleware costs every
request two more coroutine layers (the middleware and aiohttp's own current-app wrapper),
which measured ~8 % of the CPU of a signed webhook (bench/ingest.py: 74-77 µs per request
without, 83-84 with). Wrapping at registration costs one call, and the route's metric label
is fixed in advance. Unmatched paths and methods reach ``fallback``, the last route, which
answers the JSON 404 or 405 (with ``Allow``) aiohttp would otherwise answer as text.

Every route is also recorded in ``ROUTE_TABLE`` with its scope and its description
(``doc``, a ``gateway.api.spec.Operation``), from which ``gateway.api.openapi`` builds the
OpenAPI document; a route registered without one is named by ``tests/api/test_openapi.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
from aiohttp import web

from gateway.api import parser_log
from gateway.api.connection_settings import ConnectionSettings
from gateway.api.deadlines import Deadlines
from gateway.api.errors import RETRY_AFTER_SECONDS, ApiError, json_error, store_error
from gateway.api.spec import Answer, Operation, Param, Route, one_of
from gateway.api.state import AUTHENTICATE, OVER_CAP, PRINCIPAL, PUBLIC, RUNTIME
from gateway.metrics import HTTP

log = logging.getLogger("gateway.web")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
UNMATCHED = "unmatched"
# Every route added through this module, in order: the OpenAPI document's source.
ROUTE_TABLE: web.AppKey[list[Route]] = web.AppKey("route_table", list)


_observe = HTTP.observe


_CLOSED = {"WWW-Authenticate": 'Bearer error="invalid_token"'}
# The budget of an inbound write (signed webhooks, jobs, chat platform events), from its body
# being in to its answer: a stalled or unreachable store gives 503 + Retry-After within it,
# whatever the stores' own timeouts (Redis 3 s, a coalesced flush 5 s), so a sender waits at
# most 2 s for its answer (the last quarter second is the answer's way back).
WRITE_BUDGET_SECONDS = 1.75


def guarded(handler: Handler, route: str, max_bytes: int, scope: str = PUBLIC,
            query_token: bool = False, checks_revocation: bool = False,
            body_seconds: float = 30.0, budget: float | None = None) -> Handler:
    """``handler`` behind the size limit, the credential check for ``scope`` (none for
    ``PUBLIC``), JSON errors and metrics labelled ``route``. ``checks_revocation``: the
    handler reads the principal's ``revocation_mark`` inside its own write. A body still on
    its way when the handler would start is read first, within ``body_seconds`` (else 408),
    so a slow sender holds its connection no longer, whatever the handler reads it with.
    ``budget``: once the body is in, the credential check and the handler get this many
    seconds, then 503 + ``Retry-After`` (``WRITE_BUDGET_SECONDS`` for inbound writes)."""

    deadlines = None if budget is None else Deadlines(budget)

    async def guarded_handler(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        length = request.content_length
        try:
            if length is not None and length > max_bytes:
                # Refuse on the declared length, before a byte of the body is read.
                raise ApiError(413, "payload_too_large",
                               f"body of {length} bytes is over the limit of {max_bytes}",
                               {"Connection": "close"})
            if request.body_exists and not request.content.is_eof():
                await _read_in_time(request, body_seconds)
            if deadlines is None:
                response = await run(request)
            else:
                entry = deadlines.enter()
                try:
                    response = await run(request)
                except asyncio.CancelledError:
                    if not deadlines.leave(entry, cancelled=True):
                        raise
                    raise _over_budget(deadlines.seconds) from None
                except TimeoutError:
                    raise _over_budget(deadlines.seconds) from None
                finally:
                    deadlines.leave(entry)
        except Exception as exc:
            response = _error_response(exc, route)
        _observe(route, response.status, time.perf_counter() - started)
        return response

    async def checked(request: web.Request) -> web.StreamResponse:
        if scope != PUBLIC:
            over_cap = request.app.get(OVER_CAP)
            if over_cap and request.transport in over_cap:
                raise ApiError(503, "busy", "this server holds too many connections; "
                               "only health checks and signed deliveries are served",
                               {"Retry-After": "5", "Connection": "close"})
            authenticate = request.app.get(AUTHENTICATE)
            if authenticate is None:  # nothing can vouch for anyone: closed
                raise ApiError(401, "unauthorized", "no credentials are configured", _CLOSED)
            request[PRINCIPAL] = await authenticate(request, scope, query_token,
                                                    checks_revocation)
        return await handler(request)

    # A public route needs no credential check: its handler runs without that coroutine
    # layer (~0.5 µs a request, on the signed webhooks).
    run = handler if scope == PUBLIC else checked
    guarded_handler.__name__ = getattr(handler, "__name__", "handler")
    guarded_handler.__doc__ = handler.__doc__
    return guarded_handler


def _over_budget(seconds: float) -> ApiError:
    return ApiError(503, "store_unavailable", f"a store did not answer within {seconds:g} s; "
                    "retry later", {"Retry-After": str(RETRY_AFTER_SECONDS)})


async def _read_in_time(request: web.Request, seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            await request.read()  # kept by aiohttp: the handler's read returns it
    except TimeoutError:
        raise ApiError(408, "request_timeout", f"the body did not arrive within {seconds:g} s",
                       {"Connection": "close"}) from None


def _limits(app: web.Application) -> tuple[int, float]:
    settings = app[RUNTIME].settings
    return settings.max_body_bytes, ConnectionSettings.from_settings(settings).body_seconds


def _record(app: web.Application, method: str, path: str, scope: str, query_token: bool,
            doc: Operation | None) -> None:
    if ROUTE_TABLE not in app:
        app[ROUTE_TABLE] = []
    app[ROUTE_TABLE].append(Route(method, path, scope, query_token, doc))


def add(app: web.Application, method: str, path: str, handler: Handler, *, scope: str,
        query_token: bool = False, checks_revocation: bool = False,
        doc: Operation | None = None, budget: float | None = None) -> None:
    """Register ``handler`` for ``method`` on ``path``, guarded (the only way routes are
    added). Every route names the scope a credential needs (``PUBLIC``: none), so a new
    route cannot be added open by forgetting; ``query_token`` also accepts the credential as
    ``?access_token=`` (only where a browser cannot set headers: EventSource). ``doc``
    describes the route for the OpenAPI document; ``budget``: seconds from the body being
    in to the answer (then 503)."""
    max_bytes, body_seconds = _limits(app)
    app.router.add_route(method, path, guarded(handler, path, max_bytes, scope, query_token,
                                               checks_revocation, body_seconds, budget))
    _record(app, method, path, scope, query_token, doc)


def get(app: web.Application, path: str, handler: Handler, *, scope: str,
        query_token: bool = False, doc: Operation | None = None) -> None:
    """GET (and HEAD, as aiohttp's ``add_get`` does)."""
    max_bytes, body_seconds = _limits(app)
    app.router.add_get(path, guarded(handler, path, max_bytes, scope, query_token,
                                     body_seconds=body_seconds))
    _record(app, "GET", path, scope, query_token, doc)


def post(app: web.Application, path: str, handler: Handler, *, scope: str,
         checks_revocation: bool = False, doc: Operation | None = None,
         budget: float | None = None) -> None:
    """POST; ``checks_revocation``: the handler's write refuses a revoked credential itself
    (``Principal.revocation_mark``), which saves the request a round trip; ``budget``: as
    for ``add`` (``WRITE_BUDGET_SECONDS`` on the inbound write routes)."""
    add(app, "POST", path, handler, scope=scope, checks_revocation=checks_revocation, doc=doc,
        budget=budget)


def static(app: web.Application, prefix: str, directory: Path, *,
           names: frozenset[str] | None = None, tag: str = "") -> None:
    """Files of ``directory`` (no subdirectories; only ``names`` when given) under
    ``prefix``, guarded like any route."""
    root = directory.resolve()
    found = {path.name for path in root.iterdir() if path.is_file()}
    served = found if names is None else found & names

    async def static_file(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in served:  # a fixed set: no path from the request reaches the disk
            raise web.HTTPNotFound()
        return web.FileResponse(root / name)

    doc = Operation(
        "A static file", {200: Answer("the file", {"type": "string"}, media="*/*")},
        errors={404: "no such file"}, stores=False, tag=tag,
        params=(Param("name", one_of(*sorted(served)), "the file's name", where="path",
                      required=True),))
    get(app, prefix.rstrip("/") + "/{name}", static_file, scope=PUBLIC, doc=doc)


def fallback(app: web.Application) -> None:
    """The last route: JSON 404 for an unknown path, 405 with ``Allow`` for a known path
    asked with another method. Must be added after every other route. What never reaches a
    route (refused by the HTTP parser) is logged without a traceback (``parser_log``)."""
    parser_log.install()

    async def unmatched(request: web.Request) -> web.StreamResponse:
        allowed: set[str] = set()
        for resource in request.app.router.resources():
            if resource is this:
                continue
            match, methods = await resource.resolve(request)
            if match is None:
                allowed |= methods
        if allowed:
            raise web.HTTPMethodNotAllowed(request.method, sorted(allowed))
        raise web.HTTPNotFound()

    max_bytes, body_seconds = _limits(app)
    this = app.router.add_route("*", "/{tail:.*}", guarded(
        unmatched, UNMATCHED, max_bytes, body_seconds=body_seconds)).resource


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
                          {"Retry-After": str(RETRY_AFTER_SECONDS)})
    if isinstance(exc, asyncpg.DataError):
        # PostgreSQL refused a value the request carried (a NUL byte, a number out of
        # range): the sender's mistake, so a 400 and a warning, not a traceback.
        log.warning("database refused a value on %s: %s", route, type(exc).__name__)
        return json_error(400, "bad_request", "a value in the request cannot be stored "
                          "(e.g. a NUL character, or a number out of range)")
    mapped = store_error(exc)
    if mapped is None:
        log.exception("unhandled error on %s", route, exc_info=exc)
        return json_error(500, "internal_error", "unexpected error; see server log")
    log.warning("store refused on %s: %s", route, type(exc).__name__)
    return json_error(mapped.status, mapped.code, mapped.detail, mapped.headers)
