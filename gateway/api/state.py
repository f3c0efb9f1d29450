"""What components share on the aiohttp application: the open stores (``RUNTIME``) and the
readiness registry that ``/readyz`` reports."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

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


class Principal(Protocol):
    """Who a request is (the access room builds it): what it may do and read."""

    @property
    def owner(self) -> str: ...
    @property
    def is_admin(self) -> bool: ...
    @property
    def expires_at(self) -> float | None: ...
    @property
    def account(self) -> str | None: ...
    @property
    def topics(self) -> tuple[str, ...]:
        """Its topic patterns (a name, or a prefix ending in ``*``)."""
    @property
    def revocation_mark(self) -> str | None:
        """A revocation mark the route's own write must find absent (set only on routes
        that check it themselves, in the same script as their write); None: checked."""

    def allows(self, scope: str) -> bool: ...
    def may_read(self, topic: str) -> bool: ...
    def reads_links_to(self, topic: str) -> bool:
        """May a chat linked to its account grant ``topic`` (only where its issuer could
        read it itself)?"""


# Authenticates a request for a route's scope: the principal, or an ApiError (401/403/429).
# Arguments: the request, the scope, whether ``?access_token=`` counts, whether the route
# checks a revocation mark itself (see ``Principal.revocation_mark``).
Authenticate = Callable[[web.Request, str, bool, bool], Awaitable[Principal]]
AUTHENTICATE: web.AppKey[Authenticate] = web.AppKey("authenticate")
# The 401 for a credential found revoked by the route itself, counted like any other.
Refuse = Callable[[web.Request, str], Awaitable[Exception]]
REFUSE: web.AppKey[Refuse] = web.AppKey("refuse")
# Is an authenticated principal still valid (not revoked since)? For long-lived requests.
StillValid = Callable[[Principal], Awaitable[bool]]
STILL_VALID: web.AppKey[StillValid] = web.AppKey("still_valid")
# The topics among these that a principal may read through something other than its own
# patterns (a chat linked to its account).
TopicGrant = Callable[[Principal, list[str]], Awaitable[set[str]]]
TOPIC_GRANT: web.AppKey[TopicGrant] = web.AppKey("topic_grant")
PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("principal")  # who the request is
# The client's address as the barrier counts it (through trusted proxies, right to left;
# IPv6 by /64): per-client caps key on it, so a proxy's clients are told apart.
ClientAddress = Callable[[web.Request], str]
CLIENT_ADDRESS: web.AppKey[ClientAddress] = web.AppKey("client_address")
PUBLIC = "public"  # the scope of routes that need no credential (signed or harmless ones)
# Connections accepted past the connection cap (``gateway.web.connections``): they may reach
# only ``PUBLIC`` routes (health probes, signed inbound deliveries).
OVER_CAP: web.AppKey[set[asyncio.BaseTransport]] = web.AppKey("over_cap", set)


def principal_of(request: web.Request) -> Principal:
    """The principal the route guard authenticated (only on routes with a scope)."""
    return request[PRINCIPAL]
