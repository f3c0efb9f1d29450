"""Shared set-up for the Mattermost listener tests: fast timings and a running listener."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from gateway.config import Secret, Settings
from gateway.inbound.mattermost.component import MattermostBot
from gateway.inbound.mattermost.listener import Listener
from gateway.inbox.consumer import Process
from gateway.inbox.entry import Entry
from gateway.outbound.delivery import Send
from gateway.stores.runtime import Runtime
from tests.fakes.pytest_plugin import MATTERMOST_TOKEN

LEASE_SECONDS = 2
# Everything in seconds, a few hundred times shorter than in production.
FAST: dict[str, Any] = {
    "health_ttl": 1.5,
    "health_interval": 0.2,
    "backoff_initial": 0.05,
    "backoff_max": 0.4,
    "healthy_after": 30,
    "catchup_margin": 1,
    "catchup_lookback": 30,
    "ws_heartbeat": 5,
    "drain_seconds": 2,
}
INBOX_FAST: dict[str, Any] = {"lease_seconds": 2, "poll_seconds": 0.05, "outage_delay": 0.2,
                              "failure_delay": 0.2, "drain_seconds": 2}


async def echo_handler(entry: Entry, send: Send) -> None:
    """Answer every post with its own text: the listener's behaviour without a conversation."""
    await send(f"echo: {entry.incoming.text}")


def mattermost_settings(settings: Settings, url: str, **fast: Any) -> Settings:
    """Settings that point the listener at ``url`` (a fake) with test timings."""
    return dataclasses.replace(
        settings, mattermost_url=url, mattermost_token=Secret(MATTERMOST_TOKEN),
        listener_lease_seconds=LEASE_SECONDS,
        sections={**settings.sections, "mattermost": {**FAST, **fast}, "inbox": INBOX_FAST})


@contextlib.asynccontextmanager
async def running(runtime: Runtime, handler: Process | None = echo_handler,
                  instance: str | None = None) -> AsyncIterator[Listener]:
    """The listener and its inbox consumer for the duration of the block (``handler`` None:
    the conversation service answers); stopped cleanly afterwards."""
    bot = MattermostBot(runtime, handler, instance=instance)
    stop = asyncio.Event()
    task = asyncio.create_task(bot.run(stop))
    try:
        yield bot.listener
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await task
