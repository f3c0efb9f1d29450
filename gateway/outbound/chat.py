"""Posting to a chat on behalf of something other than a conversation (notifications): what
a platform adapter offers (``ChatPoster``), registered on the application by the adapter
that owns the platform's client (``CHAT_POSTERS``), so one client per platform serves both
replies and notifications.

Every notification message carries a mark (Slack message metadata, Mattermost post props);
``posted`` finds a message by its mark, which is the look before a retried post. Telegram's
Bot API cannot be asked what a chat holds (``can_look`` is False there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

NOTIFICATION_EVENT = "gateway_notification"  # Slack metadata event_type, Mattermost prop


class ChatPoster(Protocol):
    @property
    def platform(self) -> str: ...
    @property
    def can_look(self) -> bool:
        """Whether ``posted`` can see the chat (else it answers False: never posted)."""

    async def post(self, chat: str, text: str, mark: str) -> None:
        """Post ``text`` in ``chat`` carrying ``mark``; raises what the platform answered
        (``gateway.outbound.errors``: ``RetryLater``, ``Undeliverable``, or any other)."""

    async def posted(self, chat: str, mark: str, since: float) -> bool:
        """Is a message carrying ``mark`` in ``chat``, posted at or after ``since`` (Unix
        seconds)?"""


CHAT_POSTERS: web.AppKey[dict[str, ChatPoster]] = web.AppKey("chat_posters", dict)


def register_poster(app: web.Application, poster: ChatPoster) -> None:
    """The adapter of ``poster.platform`` offers it to the notifications."""
    if CHAT_POSTERS not in app:
        app[CHAT_POSTERS] = {}
    app[CHAT_POSTERS][poster.platform] = poster


@dataclass(frozen=True)
class ChatDestination:
    """A chat as the platform limits name it (``gateway.outbound.delivery.limit_names``)."""

    platform: str
    chat: str
    thread: str | None = None
    team: str | None = None
