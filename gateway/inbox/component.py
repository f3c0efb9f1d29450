"""The inbox of one chat platform inside ``gateway serve``: its queue, its consumer and the
consumer's lifecycle next to the HTTP server.

Tunables come from an optional ``[inbox]`` table (``lease_seconds``, ``max_per_chat``,
``max_failures``, ``max_chats``, ``poll_seconds``, ``outage_delay``, ``failure_delay``,
``drain_seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.api.errors import RETRY_AFTER_SECONDS, ApiError
from gateway.config import Settings, field_types, positive_numbers
from gateway.conversations.model import chat_key
from gateway.conversations.service import service_for
from gateway.inbox.consumer import ConsumerConfig, InboxConsumer, Process, SenderFor
from gateway.inbox.entry import Entry
from gateway.inbox.queue import Inbox, InboxLimits, Pushed
from gateway.outbound.delivery import Send
from gateway.stores.runtime import Runtime, chat_pipeline

_LIMITS = field_types(InboxLimits)
_CONSUMER = field_types(ConsumerConfig)


def configs(settings: Settings) -> tuple[InboxLimits, ConsumerConfig]:
    """The ``[inbox]`` table split into the queue's limits and the consumer's timings."""
    section = settings.section("inbox")
    values = positive_numbers(section, {**_LIMITS, **_CONSUMER}, "GATEWAY_CONFIG [inbox]")
    return (InboxLimits(**{k: v for k, v in values.items() if k in _LIMITS}),  # type: ignore[arg-type]
            ConsumerConfig(**{k: v for k, v in values.items() if k in _CONSUMER}))  # type: ignore[arg-type]


class PlatformInbox:
    """What an adapter holds: push an accepted event, and the consumer that answers it."""

    def __init__(self, runtime: Runtime, platform: str, sender_for: SenderFor,
                 process: Process | None = None) -> None:
        limits, config = configs(runtime.settings)
        self.runtime = runtime
        self.queue = Inbox(runtime.durable, platform, limits, chat_pipeline(runtime),
                           shards=runtime.settings.inbox_shards)
        self.consumer = InboxConsumer(runtime, self.queue, sender_for,
                                      process or self._process, config)

    async def push(self, entry: Entry, claim_key: str | None) -> Pushed:
        """Durable before it returns ACCEPTED (or DUPLICATE); raises when redis-durable
        refuses or is unreachable (the route answers 503 + Retry-After). FULL and
        IN_PROGRESS are refusals too: ``refusal`` gives the route its 503."""
        pushed = await self.queue.push(chat_key(entry.incoming), entry, claim_key,
                                       self.runtime.settings.dedup_ttl)
        if pushed is Pushed.ACCEPTED:
            self.consumer.wake()
        return pushed

    async def _process(self, entry: Entry, send: Send) -> None:
        """The conversation service: store, answer, deliver (idempotent on redelivery)."""
        await service_for(self.runtime).handle_leased(entry.incoming, send)

    def run_with(self, app: web.Application, ready: asyncio.Event | None = None) -> None:
        """Run the consumer while the app runs, from when ``ready`` is set (the adapter can
        send); at shutdown it finishes or gives back what it holds. It is told to stop as
        the app's shutdown begins (``on_shutdown``), so every platform's consumer drains at
        the same time as the others and as the requests in flight, not one after another in
        the cleanup."""
        stop = asyncio.Event()

        async def consume() -> None:
            if ready is not None:
                await _first_set(ready, stop)
            await self.consumer.run(stop)

        async def stopping(app: web.Application) -> None:
            stop.set()

        async def lifecycle(app: web.Application) -> AsyncIterator[None]:
            stop.clear()
            task = asyncio.create_task(consume())
            yield
            stop.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.consumer.config.drain_seconds + 5):
                    await asyncio.shield(task)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        app.on_shutdown.append(stopping)
        app.cleanup_ctx.append(lifecycle)


_REFUSALS = {
    Pushed.FULL: "too many messages waiting for this chat",
    Pushed.IN_PROGRESS: "an earlier attempt of this event is still being taken in",
}


def refusal(pushed: Pushed) -> ApiError | None:
    """The 503 + ``Retry-After`` a route answers for a push that took nothing in and must be
    retried (a full chat; on a cluster, a claim another attempt still holds), else None."""
    detail = _REFUSALS.get(pushed)
    if detail is None:
        return None
    return ApiError(503, "backpressure", detail, {"Retry-After": str(RETRY_AFTER_SECONDS)})


async def _first_set(*events: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
