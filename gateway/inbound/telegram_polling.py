"""Telegram long polling that confirms only what is stored.

``getUpdates`` confirms every update below the ``offset`` it is called with, so the offset
is ours to move: it passes an update only once ``accept`` stored it in the inbox (or found
it a duplicate, or an update we ignore). An update that could not be stored (its chat is
full, redis-durable is out of reach, maintenance is on) stays unconfirmed with everything
after it, and the next poll, ``retry_seconds`` later, fetches it again: Telegram keeps the
queue, as it keeps retrying a webhook delivery that failed. PTB's Updater confirms an update
before its handler has run, so a failed handler lost the update; it is not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from redis.exceptions import RedisError
from telegram import Bot, Update
from telegram.error import RetryAfter, TelegramError

from gateway.api.errors import ApiError
from gateway.outbound.errors import retry_after_of
from gateway.stores.redis import UNREACHABLE

log = logging.getLogger("gateway.telegram")

Accept = Callable[[Update], Awaitable[None]]


class Poller:
    """One bot's ``getUpdates`` loop; ``offset`` is the first update not yet stored."""

    def __init__(self, bot: Bot, accept: Accept, *, timeout: int, retry_seconds: float,
                 allowed_updates: Sequence[str]) -> None:
        self.bot = bot
        self.accept = accept
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.allowed_updates = list(allowed_updates)
        self.offset: int | None = None
        self.confirmed: int | None = None  # the offset Telegram was last called with

    async def start(self) -> None:
        """getUpdates refuses to run while a webhook is set."""
        await self.bot.delete_webhook()

    async def run(self) -> None:
        while True:
            updates = await self._fetch()
            if updates is None:
                continue
            for update in updates:
                if not await self._store(update):
                    await asyncio.sleep(self.retry_seconds)
                    break
                self.offset = update.update_id + 1

    async def confirm(self) -> None:
        """At shutdown: confirm what was stored since the last poll (best effort: an
        unconfirmed stored update is fetched again and found a duplicate)."""
        if self.offset is None or self.offset == self.confirmed:
            return
        with contextlib.suppress(TelegramError, TimeoutError):
            async with asyncio.timeout(5):
                await self.bot.get_updates(offset=self.offset, limit=1, timeout=0,
                                           allowed_updates=self.allowed_updates)

    async def _fetch(self) -> tuple[Update, ...] | None:
        """The next updates, or None after a failed poll (waited out already)."""
        try:
            updates = await self.bot.get_updates(offset=self.offset, timeout=self.timeout,
                                                 allowed_updates=self.allowed_updates)
        except RetryAfter as exc:
            await asyncio.sleep(retry_after_of(exc) or self.retry_seconds)
            return None
        except TelegramError as exc:  # network, conflict (a webhook or another poller)...
            log.warning("telegram: getUpdates failed (%s: %s); retrying in %.1f s",
                        type(exc).__name__, exc, self.retry_seconds)
            await asyncio.sleep(self.retry_seconds)
            return None
        self.confirmed = self.offset
        return updates

    async def _store(self, update: Update) -> bool:
        """Put the update in the inbox; False when it must be fetched again."""
        try:
            await self.accept(update)
        except (RedisError, *UNREACHABLE) as exc:
            log.warning("telegram: update %s not stored (%s); fetched again in %.1f s",
                        update.update_id, type(exc).__name__, self.retry_seconds)
            return False
        except ApiError as exc:
            if exc.status == 503:  # a full chat, maintenance: as Telegram would retry it
                log.info("telegram: update %s refused for now (%s); fetched again in %.1f s",
                         update.update_id, exc.code, self.retry_seconds)
                return False
            log.error("telegram: update %s refused (%s); skipped", update.update_id, exc)
        except Exception:  # a fault of ours with this update: never wedge the whole bot
            log.exception("telegram: update %s could not be handled; skipped",
                          update.update_id)
        return True
