"""Chat destinations: a Telegram chat, a Slack or Mattermost channel.

A row becomes a message from the subscription's template (``subscriptions.render``), posted
through the platform adapter's client (``gateway.outbound.chat``), after the platform limits
of section 5 (the ``rl:`` buckets of replies: Telegram 1/s per chat, 20/min per group, 30/s
per bot; Slack 1/s per channel; Mattermost 10/s per bot). Waiting for a bucket is not a
failure. Rows that arrived while the subscription waited are not sent one message each: the
runner gathers what waits (of the same topic, in order) into one digest, ``N new on
<topic>:`` and a line per row, as many as the platform's message holds (Telegram 4,096
characters, Slack 40,000, Mattermost 16,383); the rest goes in the next. So a burst never
queues a message per row behind the limit, and no row is dropped or shown twice.

Exactly once as the chat sees it: before a post the runner writes the message's mark
(``sending``) to the subscription; the post carries the mark (Slack metadata, Mattermost
props); the cursor move after it clears it. A successor finding a mark set asks the platform
whether the message is there (``posted``) and only moves the cursor when it is. Telegram
cannot be asked, so a message posted in the instant before a holder was killed can show
twice there, as replies can.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from gateway.config import Settings
from gateway.notifications.held import Held
from gateway.notifications.outcome import OK, Outcome
from gateway.notifications.subscriptions import CHAT_FIELDS, render
from gateway.outbound.chat import CHAT_POSTERS, ChatDestination, ChatPoster
from gateway.outbound.delivery import admit, limit_names
from gateway.outbound.errors import StoreOutage, Undeliverable, retry_after_of
from gateway.outbound.live import MAX_CHARS, fit
from gateway.push.protocol import FeedRow
from gateway.ratelimit import Limiter, Rate
from gateway.ratelimit.limits import platform_limits

MAX_DIGEST_ROWS = 500


class ChatSender:
    def __init__(self, poster: ChatPoster | None, held: Held, limiter: Limiter,
                 table: dict[str, dict[str, Rate]]) -> None:
        self.poster = poster
        self.platform = held.type
        self.chat = str(held.destination[CHAT_FIELDS[self.platform]])
        self.template = held.template
        self.max_chars = MAX_CHARS[self.platform]
        self.limiter = limiter
        self.limits = limit_names(ChatDestination(self.platform, self.chat), table)

    @property
    def can_look(self) -> bool:
        return self.poster is not None and self.poster.can_look

    async def admit(self) -> None:
        """Wait until every platform bucket of this chat admits a message."""
        await admit(self.limiter, self.limits)

    def line(self, row: FeedRow) -> str:
        return render(self.template, row)

    def fits(self, topic: str, count: int, size: int) -> bool:
        """Would a digest of ``count`` lines of ``size`` characters (newlines included) fit
        one message?"""
        return len(self.header(topic, count)) + size <= self.max_chars

    @staticmethod
    def header(topic: str, count: int) -> str:
        return f"{count} new on {topic}:\n"

    def text(self, topic: str, lines: list[str]) -> str:
        if len(lines) == 1:
            return fit(lines[0], self.max_chars)
        return self.header(topic, len(lines)) + "\n".join(lines)

    async def send(self, text: str, mark: str) -> Outcome:
        if self.poster is None:
            return Outcome("failed", f"{self.platform} is not configured in this process")
        try:
            await self.poster.post(self.chat, text, mark)
        except StoreOutage:
            raise
        except Undeliverable as exc:
            return Outcome("gone", f"{self.platform}: {str(exc)[:300]}")
        except Exception as exc:
            wait = retry_after_of(exc)
            detail = f"{type(exc).__name__}: {str(exc)[:300]}"
            return Outcome("wait", detail, wait) if wait is not None else Outcome(
                "failed", detail)
        return OK

    async def posted(self, mark: str, since: float) -> bool:
        return self.poster is not None and await self.poster.posted(self.chat, mark, since)


ChatSenderFactory = Callable[[Held], "ChatSender"]


def chat_senders(app: web.Application, settings: Settings,
                 limiter: Limiter) -> ChatSenderFactory:
    """The engine's factory of chat senders, over the posters the platform components left
    on ``app`` (read when a subscription is taken: the components register theirs first)."""
    table = platform_limits(settings)

    def build(held: Held) -> ChatSender:
        return ChatSender(app.get(CHAT_POSTERS, {}).get(held.type), held, limiter, table)

    return build

