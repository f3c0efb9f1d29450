"""CORS for the routes browsers call (``/v1/feed``, ``/v1/stream``, ``/v1/jobs``,
``/v1/search``, ``/v1/auth/...``), for the origins of ``GATEWAY_CORS_ORIGINS`` only.

Credentials are bearer tokens, never cookies, so no ``Allow-Credentials``. The headers go on
through ``on_response_prepare`` (streams prepare their response themselves), registered only
when origins are configured: without them nothing runs per response."""

from __future__ import annotations

from aiohttp import web

from gateway.api import routes
from gateway.api.spec import Answer, Operation, Param, string
from gateway.api.state import PUBLIC
from gateway.stores.runtime import Runtime

PATHS = ("/v1/feed", "/v1/stream", "/v1/jobs", "/v1/jobs/{id}", "/v1/search",
         "/v1/auth/token", "/v1/auth/refresh", "/v1/auth/revoke", "/v1/auth/link-code",
         "/v1/auth/links", "/v1/auth/links/{id}")
PREFIXES = ("/v1/feed", "/v1/stream", "/v1/jobs", "/v1/search", "/v1/auth/")
ALLOW_HEADERS = "Authorization, Content-Type, Last-Event-ID"
EXPOSE_HEADERS = "Retry-After, X-Stream-Cursor, X-Stream-Epochs"
MAX_AGE = "600"


PREFLIGHT = Operation(
    "A CORS preflight (GATEWAY_CORS_ORIGINS): the Access-Control-Allow-* headers for an "
    "allowed Origin, none for another",
    {204: Answer("no body", media="")},
    params=(Param("Origin", string(), "the page's origin", where="header"),),
    stores=False, tag="cors")


def setup(app: web.Application, runtime: Runtime) -> None:
    allowed = frozenset(runtime.settings.cors_origins)
    if not allowed:
        return

    def origin_of(request: web.Request) -> str | None:
        origin = request.headers.get("Origin")
        if origin in allowed and request.path.startswith(PREFIXES):
            return origin
        return None

    async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
        if not request.path.startswith(PREFIXES):
            return
        # Every answer of these routes depends on Origin (the allowed ones get the headers,
        # others and none do not): a shared cache must not hand one origin's to another.
        if not any("origin" in v.lower() for v in response.headers.getall("Vary", [])):
            response.headers.add("Vary", "Origin")
        origin = origin_of(request)
        if origin is not None:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS

    async def preflight(request: web.Request) -> web.Response:
        response = web.Response(status=204)
        if origin_of(request) is not None:
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
            response.headers["Access-Control-Allow-Headers"] = ALLOW_HEADERS
            response.headers["Access-Control-Max-Age"] = MAX_AGE
        return response

    app.on_response_prepare.append(add_headers)
    for path in PATHS:
        routes.add(app, "OPTIONS", path, preflight, scope=PUBLIC,  # a preflight has none
                   doc=PREFLIGHT)
