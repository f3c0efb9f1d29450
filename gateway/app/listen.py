"""``gateway listen mattermost``: the Mattermost listener and its inbox consumer, without the
HTTP server."""

from __future__ import annotations

import argparse
import asyncio
import logging

from gateway.app.process import install_stop_signals, preflight
from gateway.config import Settings
from gateway.inbound.mattermost.component import MattermostBot, listener_config
from gateway.stores.runtime import open_runtime

log = logging.getLogger("gateway.mattermost")


async def listen(settings: Settings, stop: asyncio.Event | None = None) -> int:
    stop = stop or asyncio.Event()
    install_stop_signals(stop)
    if not await preflight(settings):
        return 1
    runtime = await open_runtime(settings, pg_max_size=4)
    try:
        bot = MattermostBot(runtime)
        log.info("mattermost listener %s starting", bot.listener.instance)
        await bot.run(stop)
    finally:
        await runtime.close()
    return 0


def main(args: argparse.Namespace, settings: Settings) -> int:
    listener_config(settings)  # configuration errors before any connection
    return asyncio.run(listen(settings))
