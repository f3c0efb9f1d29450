"""Builds the aiohttp application from components.

A component is a module with ``setup(app, runtime)`` that adds its routes (through
``gateway.api.routes``), background tasks (``app.cleanup_ctx``) and readiness checks. The
list below is the whole HTTP surface.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from aiohttp import web

from gateway.access import authenticate
from gateway.api import routes
from gateway.api.state import CLIENT_ADDRESS, OVER_CAP, RUNTIME, ClientAddress
from gateway.inbound.http_intake import install as install_inbound
from gateway.stores.runtime import Runtime
from gateway.stores.warm import warm

COMPONENTS: tuple[str, ...] = (
    "gateway.web.cors",
    "gateway.web.health",
    "gateway.inbound.webhooks",
    "gateway.inbound.jobs",
    "gateway.inbound.mattermost.component",
    "gateway.inbound.platform_bots",  # Telegram, then Slack, each when configured
    "gateway.web.admin",
    "gateway.web.search",
    "gateway.push.web",
    "gateway.web.dashboard",
    "gateway.web.auth",
    "gateway.web.events",
    "gateway.web.subscriptions",
    "gateway.notifications.component",
    "gateway.web.reference",
)


def create_app(runtime: Runtime, components: Sequence[str] = COMPONENTS) -> web.Application:
    settings = runtime.settings
    # No middlewares: every route is guarded at registration (gateway.api.routes, which
    # says why); unmatched requests reach the fallback route added last.
    app = web.Application(client_max_size=settings.max_body_bytes)
    app[RUNTIME] = runtime
    app[OVER_CAP] = set()  # filled by the connection gate of ``serve`` (web.connections)
    # Every scoped route checks credentials; a 401 counts in the same per-address barrier
    # as a bad webhook signature.
    barrier = install_inbound(app, runtime).barrier
    authenticate.install(app, runtime, barrier)
    client_address: ClientAddress = barrier.client_ip
    app[CLIENT_ADDRESS] = client_address
    for name in components:
        importlib.import_module(name).setup(app, runtime)
    routes.fallback(app)

    async def warm_durable(app: web.Application) -> None:
        # Before the socket listens: the first request finds its scripts loaded.
        await warm(runtime.durable)

    app.on_startup.append(warm_durable)
    return app
