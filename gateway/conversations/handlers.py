"""Conversation handlers: async callables that turn a stored message into a reply.

Chosen by configuration (``[conversations] handler = ...``): ``"default"`` (help, status,
echo), ``"http"`` (POST the conversation to ``handler_url``, send back its answer), ``"llm"``
(a model's reply, streamed: ``llm.py``, chosen by the service) or any
``"package.module:function"``. A handler returns the reply text, the reply as it is written
(an async iterator of text deltas), or None for no reply.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.config import ConfigError, Settings
from gateway.conversations.model import Incoming
from gateway.conversations.store import Message
from gateway.ratelimit import Providers
from gateway.stores.runtime import Runtime


@dataclass(frozen=True)
class Context:
    """What a handler sees: the message, its conversation, and the shared budgets."""

    runtime: Runtime
    incoming: Incoming
    conversation_id: int
    message_count: int  # messages in the conversation, this one included
    command: str | None  # "new", "help", ... for "/new", "/help"; None for plain text
    new_conversation: bool  # this message started the conversation (/new or first contact)
    providers: Providers
    history: Callable[[int], Awaitable[list[Message]]] = field(repr=False)


# A handler answers with the whole reply, with the reply as it is written (an async
# iterator of text deltas, e.g. a model's stream: the chat sees it grow), or with None.
Reply = str | AsyncIterator[str] | None
Handler = Callable[[Context], Awaitable[Reply]]

HELP = ("Commands: /new starts a new conversation, /status shows this conversation, "
        "/help shows this text. Anything else is answered by the bot.")


async def default_handler(ctx: Context) -> str | None:
    """Answers /help, /new and /status, and echoes anything else with the message count."""
    if ctx.command == "help":
        return HELP
    if ctx.command == "new":
        return f"Started a new conversation (#{ctx.conversation_id})."
    if ctx.command == "status":
        return f"Conversation #{ctx.conversation_id}: {ctx.message_count} messages."
    return f"echo: {ctx.incoming.text} ({ctx.message_count} messages)"


class HttpHandler:
    """POSTs ``{conversation_id, platform, chat, thread, command, message, messages}`` to a
    URL and sends back its ``reply``.

    The answer must be JSON ``{"reply": str | null}``. A slow or failing endpoint raises;
    the service then answers with an apology instead of staying silent.
    """

    def __init__(self, url: str, timeout: float = 20.0, history: int = 20) -> None:
        self.url = url
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.history = history

    async def __call__(self, ctx: Context) -> str | None:
        body = {
            "conversation_id": ctx.conversation_id,
            "platform": ctx.incoming.platform,
            "chat": ctx.incoming.chat,
            "thread": ctx.incoming.thread,
            "command": ctx.command,
            "message": {"text": ctx.incoming.text, "user_id": ctx.incoming.user_id,
                        "user_name": ctx.incoming.user_name,
                        "message_id": ctx.incoming.message_id},
            "messages": [m.to_json() for m in await ctx.history(self.history)],
        }
        async with aiohttp.ClientSession(timeout=self.timeout) as session, \
                session.post(self.url, json=body) as response:
            response.raise_for_status()
            answer: Any = await response.json(content_type=None)
        reply = answer.get("reply") if isinstance(answer, dict) else None
        if reply is not None and not isinstance(reply, str):
            raise ValueError("handler answer: reply must be a string or null")
        return reply


def load_handler(settings: Settings) -> Handler:
    """The handler named by ``[conversations] handler`` (default: ``default``)."""
    section = settings.section("conversations")
    name = section.get("handler", "default")
    if name == "default":
        return default_handler
    if name == "http":
        url = section.get("handler_url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError("[conversations].handler_url", "must be an http(s) URL")
        return HttpHandler(url, float(section.get("handler_timeout", 20.0)),
                           int(section.get("handler_history", 20)))
    if isinstance(name, str) and ":" in name:
        module, _, function = name.partition(":")
        try:
            handler: Handler = getattr(importlib.import_module(module), function)
        except (ImportError, AttributeError) as exc:
            raise ConfigError("[conversations].handler", f"cannot load {name}: {exc}") from None
        return handler
    raise ConfigError("[conversations].handler",
                      "must be default, http, llm or module:function")
