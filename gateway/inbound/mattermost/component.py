"""The Mattermost listener as a web component: it runs inside ``gateway serve`` and
``gateway dev`` when ``MATTERMOST_URL`` is set (``gateway.app.listen`` runs it alone).

Timings come from the settings (``GATEWAY_LISTENER_LEASE_SECONDS``, ``GATEWAY_DEDUP_TTL``)
and from an optional ``[mattermost]`` table in the TOML file whose keys are the fields of
``ListenerConfig`` (``health_interval = 10``, ``backoff_max = 30``, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.api.state import add_readiness_check
from gateway.config import ConfigError, Settings, field_types, positive_numbers
from gateway.conversations.service import Incoming, handle_incoming
from gateway.inbound.mattermost import health
from gateway.inbound.mattermost.client import Post
from gateway.inbound.mattermost.listener import Listener, ListenerConfig, PostHandler, Send
from gateway.stores.runtime import Runtime

log = logging.getLogger("gateway.mattermost")

_TUNABLE = field_types(ListenerConfig, exclude=("url", "token"))


def listener_config(settings: Settings) -> ListenerConfig:
    """Build the listener's configuration; a wrong ``[mattermost]`` entry is a ConfigError."""
    if not settings.mattermost_url or not settings.mattermost_token:
        raise ConfigError("MATTERMOST_URL", "is required to run the Mattermost listener")
    values: dict[str, float | int] = {"lease_seconds": float(settings.listener_lease_seconds),
                                      "dedup_ttl": settings.dedup_ttl}
    values.update(positive_numbers(settings.section("mattermost"), _TUNABLE,
                                   "GATEWAY_CONFIG [mattermost]"))
    return ListenerConfig(url=settings.mattermost_url, token=settings.mattermost_token.get(),
                          **values)  # type: ignore[arg-type]


def default_handler(runtime: Runtime) -> PostHandler:
    """The conversation handler shared with Telegram and Slack."""
    async def handle(post: Post, send: Send) -> None:
        incoming = Incoming(platform="mattermost", chat=post.channel_id,
                            thread=post.root_id or None, user_id=post.user_id,
                            user_name=post.user_name or post.user_id, text=post.message,
                            message_id=post.id)
        await handle_incoming(runtime, incoming, send)

    return handle


def build_listener(runtime: Runtime, handler: PostHandler | None = None) -> Listener:
    return Listener(runtime, listener_config(runtime.settings),
                    handler or default_handler(runtime))


def setup(app: web.Application, runtime: Runtime) -> None:
    """Run the listener next to the HTTP server when ``MATTERMOST_URL`` is set.

    The readiness entry is not required: a standby replica (no lease) is still ready.
    """
    if not runtime.settings.mattermost_url:
        return
    listener = build_listener(runtime)
    add_readiness_check(app, "mattermost-listener", health.readiness_check(runtime),
                        required=False)

    async def run_listener(app: web.Application) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(listener.run(stop))
        yield
        stop.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, listener.config.drain_seconds + 5)

    app.cleanup_ctx.append(run_listener)
