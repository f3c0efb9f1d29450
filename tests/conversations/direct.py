"""The ``llm`` handler called directly, as the conversation service would, for one message."""

from __future__ import annotations

from gateway.conversations.handlers import Context
from gateway.conversations.llm import LlmHandler
from gateway.conversations.model import Incoming
from gateway.conversations.store import Message
from gateway.ratelimit import Limiter, Providers
from gateway.stores.runtime import Runtime


async def llm_reply(rt: Runtime, chat: str, text: str) -> str:
    """The handler's whole reply to ``text``, the first message of Telegram chat ``chat``."""
    incoming = Incoming("telegram", chat, None, "u1", "Ann", text, f"m-{chat}")

    async def history(limit: int) -> list[Message]:
        return [Message(1, 1, "user", text, "u1", "Ann")]

    ctx = Context(rt, incoming, 1, 1, None, True, Providers(Limiter(rt.durable), {}), history)
    reply = await LlmHandler(rt.settings)(ctx)
    assert reply is not None and not isinstance(reply, str)
    return "".join([delta async for delta in reply])
