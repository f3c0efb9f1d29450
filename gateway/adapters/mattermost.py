"""Mattermost entry points: ``gateway listen mattermost``, and the web component that runs the
same listener inside ``gateway serve``/``gateway dev`` when ``MATTERMOST_URL`` is set.

Timings come from the settings (``GATEWAY_LISTENER_LEASE_SECONDS``, ``GATEWAY_DEDUP_TTL``)
and from an optional ``[mattermost]`` table in the TOML file whose keys are the fields of
``ListenerConfig`` (``health_interval = 10``, ``backoff_max = 30``, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.adapters import mattermost_health as health
from gateway.adapters.mattermost_client import Post
from gateway.adapters.mattermost_listener import Listener, ListenerConfig, PostHandler, Send
from gateway.config import ConfigError, Settings, field_types, positive_numbers
from gateway.runtime import Runtime, open_runtime
from gateway.web.health import add_readiness_check

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


async def echo_handler(post: Post, send: Send) -> None:
    """Placeholder answer used until the conversation service is installed."""
    await send(f"echo: {post.message}")


def default_handler(runtime: Runtime) -> PostHandler:
    """The conversation handler shared with Telegram and Slack."""
    try:
        from gateway.conversations.service import Incoming, handle_incoming
    except ImportError:
        log.warning("gateway.conversations is not available: the listener only echoes")
        return echo_handler

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


# --- inside serve / dev ----------------------------------------------------------------

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


# --- gateway listen mattermost ---------------------------------------------------------

async def listen(settings: Settings, stop: asyncio.Event | None = None) -> int:
    from gateway.serve import install_stop_signals, preflight

    stop = stop or asyncio.Event()
    install_stop_signals(stop)
    if not await preflight(settings):
        return 1
    runtime = await open_runtime(settings, pg_max_size=4)
    try:
        listener = build_listener(runtime)
        log.info("mattermost listener %s starting", listener.instance)
        await listener.run(stop)
    finally:
        await runtime.close()
    return 0


def main_listen(args: argparse.Namespace, settings: Settings) -> int:
    listener_config(settings)  # configuration errors before any connection
    return asyncio.run(listen(settings))
