"""The delivery engine as a component of the HTTP application: every ``serve`` (and ``gateway
dev``) process delivers notifications from start to stop. Chat destinations are posted
through the platform clients the chat components left on the application
(``gateway.outbound.chat.CHAT_POSTERS``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.notifications.chat import chat_senders
from gateway.notifications.engine import Engine
from gateway.notifications.settings import NotificationSettings
from gateway.ratelimit import Limiter
from gateway.stores.runtime import Runtime

ENGINE: web.AppKey[Engine] = web.AppKey("notifications_engine", Engine)
STOP_SECONDS = 15.0


def setup(app: web.Application, runtime: Runtime) -> None:
    settings = NotificationSettings.from_settings(runtime.settings)
    if not settings.deliver:
        return
    engine = Engine(runtime, settings, chat_senders=chat_senders(
        app, runtime.settings, Limiter(runtime.durable)))
    app[ENGINE] = engine

    async def deliver(app: web.Application) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(engine.run(stop))
        yield
        stop.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, STOP_SECONDS)

    app.cleanup_ctx.append(deliver)
