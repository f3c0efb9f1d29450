"""What an adapter hands the conversation service, and how a chat is named."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway import keys

PLATFORMS = ("telegram", "slack", "mattermost")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_TEXT_FIELDS = ("chat", "thread", "user_id", "user_name", "text", "message_id", "team")


@dataclass(frozen=True)
class Incoming:
    """One inbound chat message, platform-neutral.

    ``chat`` is the platform's chat/channel id, ``thread`` the thread root (Slack thread_ts,
    Mattermost root_id) or None; ``team`` is the Slack workspace (None elsewhere).
    ``message_id`` is the platform's id for this message: a redelivery is stored once.
    """

    platform: str
    chat: str
    thread: str | None
    user_id: str
    user_name: str | None
    text: str
    message_id: str
    team: str | None = None

    def __post_init__(self) -> None:
        # PostgreSQL text holds neither NUL nor a lone surrogate: such a message would be
        # acknowledged and then never stored. Keep it, with those characters replaced.
        # A field is set only when it changes (an inbox entry builds one again as it is
        # decoded, from fields made storable already).
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str) and (fixed := storable(value)) is not value:
                object.__setattr__(self, name, fixed)
        if self.platform not in PLATFORMS:
            raise ValueError(f"platform must be one of {', '.join(PLATFORMS)}")
        if not self.chat:
            raise ValueError("chat must not be empty")


def storable(text: str) -> str:
    """``text`` with NUL and lone surrogates replaced by U+FFFD (PostgreSQL refuses both)."""
    if text.isascii() and "\x00" not in text:  # the usual case, without the regex (C speed)
        return text
    return _UNSTORABLE.sub("\ufffd", text)


def chat_key(incoming: Incoming) -> str:
    """The chat's identity within its platform (a conversation per chat; per thread in
    Slack and Mattermost)."""
    if incoming.platform == "telegram":
        return incoming.chat
    if incoming.platform == "slack":
        return f"{incoming.team or '-'}/{incoming.chat}/{incoming.thread or '-'}"
    return f"{incoming.chat}/{incoming.thread or '-'}"


def budget_key(incoming: Incoming) -> str:
    """The chat a per-chat budget counts: the Telegram chat, the Slack or Mattermost
    channel, its threads included (a new thread starts a conversation, not a budget)."""
    if incoming.platform == "slack":
        return f"{incoming.team or '-'}/{incoming.chat}"
    return incoming.chat


def pointer_key(incoming: Incoming) -> str:
    """The redis-cache key of the chat's active-conversation pointer (key registry)."""
    if incoming.platform == "telegram":
        return keys.telegram_active_conv(incoming.chat)
    if incoming.platform == "slack":
        return keys.slack_active_conv(incoming.team or "-", incoming.chat, incoming.thread)
    return keys.mattermost_active_conv(incoming.chat, incoming.thread)


def command_of(text: str) -> str | None:
    """``/new@my_bot args`` → ``new``; None when the text is not a command."""
    if not text.startswith("/"):
        return None
    word = text[1:].split(maxsplit=1)[0] if len(text) > 1 else ""
    word = word.split("@", 1)[0].lower()
    return word or None
