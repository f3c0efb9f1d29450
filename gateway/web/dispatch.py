"""The signed webhooks' route reached without aiohttp's router: the server's request handler
(``web.Server.request_handler``, what aiohttp calls with each ``web.Request``) is
``Application._handle`` behind a check of the request line.

``POST /v1/webhooks/<name>`` is the hot path of the ingest bench, and the application has
~40 routes: the router walks its prefix index, awaits the candidate's ``resolve`` (a regex
match, a match dict, a match-info object, the apps' stack frozen), and ``_handle`` adds a
coroutine layer and an ``Expect`` lookup: ~4 µs a request in all, against ~1 µs for the
match info built here directly. What the route's handler then does is unchanged: the same
guarded handler (limits, budget, JSON errors, metrics) and ``receive`` (every check).

The lean way is taken only where it is known to give what the router gives:

* a name is served this way only after the router itself has sent a request for it to the
  webhook route (the first request of each name goes the normal way and teaches it), and
  only a configured source's name (so the set stays bounded whatever senders try), written
  without ``%`` (its raw and decoded forms are the same);
* the method is ``POST``, the raw path is exactly ``/v1/webhooks/<name>`` (a query string,
  a trailing slash, an absolute-form target: the normal way), no ``Expect`` header (aiohttp's
  ``_handle`` answers ``100 Continue`` before the handler);
* the application has no middlewares and no sub-applications (otherwise nothing is
  installed), so nothing else would have seen the request.

Anything else is ``Application._handle`` as aiohttp would call it. ``serve`` installs this on
its site (``gateway.web.connections``); ``tests/web/test_dispatch.py`` holds both ways to the
same answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web
from aiohttp.web_urldispatcher import (
    AbstractRoute,
    MatchedSubAppResource,
    PrefixedSubAppResource,
    UrlMappingMatchInfo,
)

from gateway.api.state import RUNTIME

Handle = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
PREFIX = "/v1/webhooks/"
CANONICAL = PREFIX + "{source}"


def _route(app: web.Application) -> AbstractRoute | None:
    """The webhook route as registered, or None when the lean way must not be used."""
    if app.middlewares:
        return None
    found = None
    for resource in app.router.resources():
        if isinstance(resource, (PrefixedSubAppResource, MatchedSubAppResource)):
            return None
        if found is None and resource.canonical == CANONICAL:
            found = next((route for route in resource if route.method == hdrs.METH_POST), None)
    return found


def lean(app: web.Application, handle: Handle) -> Handle:
    """``handle`` (the app's ``_handle``) with the webhook route's lean way in front of it;
    ``handle`` itself when the app does not allow one."""
    route = _route(app)
    if route is None:
        return handle
    handler = route.handler
    sources = app[RUNTIME].settings.webhook_sources
    known: set[str] = set()  # names the router has sent to this route
    start = len(PREFIX)

    async def dispatch(request: web.BaseRequest) -> web.StreamResponse:
        name = None
        if request.method == hdrs.METH_POST:
            path = request.raw_path
            if path.startswith(PREFIX):
                name = path[start:]
                if name in known and hdrs.EXPECT not in request.headers:
                    match_info = UrlMappingMatchInfo({"source": name}, route)
                    match_info.add_app(app)
                    match_info.freeze()
                    request._match_info = match_info  # type: ignore[attr-defined]
                    return await handler(request)  # type: ignore[arg-type]
        response = await handle(request)
        if name is not None and name in sources and "%" not in name:
            _learn(request, route, name, known)
        return response

    return dispatch


def _learn(request: web.BaseRequest, route: AbstractRoute, name: str, known: set[str]) -> None:
    """Remember ``name`` when the router sent this request to the webhook route with it."""
    match_info: Any = getattr(request, "_match_info", None)
    if getattr(match_info, "route", None) is route and match_info.get("source") == name:
        known.add(name)


def install(server: web.Server, app: web.Application) -> None:
    """Put the lean way in front of ``server``'s handler (connections made from now on)."""
    server.request_handler = lean(app, server.request_handler)
