"""The consumer's fence around every platform call that answers a chat's head entry.

Before each call it checks, in one round trip, that the chat is still ours (a holder that
stalled past its lease stops instead of answering next to its successor: ``LeaseLost``) and
what of the head's reply left already, which ``inbox:{inbox}:<platform>:sent`` records
per chat until the head is acknowledged:

- ``<digest>``: the whole reply left; a retry of the head sends nothing.
- ``<digest> <message id>``: a reply being written shows in that message; a retry edits
  the same message (from the start of its own text) instead of posting a second one.

The digest names the head entry, so a record never applies to the next message.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from redis.exceptions import RedisError

from gateway.inbox.queue import Inbox
from gateway.outbound.delivery import Send
from gateway.outbound.live import PlatformReply


class LeaseLost(BaseException):
    """The chat's lease is someone else's now. A ``BaseException`` so that the delivery loop
    (which retries and dead-letters any ``Exception``) lets it through: we simply stop."""


class Fence:
    def __init__(self, inbox: Inbox, chat: str, token: str, head: str,
                 outage: Callable[[Exception], None]) -> None:
        self.inbox, self.chat, self.token, self.outage = inbox, chat, token, outage
        self.digest = hashlib.blake2b(head.encode(), digest_size=12).hexdigest()

    async def check(self) -> tuple[bool, str | None]:
        """(the whole reply left, the message showing it so far); raises ``LeaseLost``."""
        holds, sent = await self.inbox.before_send(self.chat, self.token)
        if not holds:
            raise LeaseLost(self.chat)
        if sent == self.digest:
            return True, None
        digest, _, ref = sent.partition(" ")
        return False, (ref or None) if digest == self.digest else None

    async def mark(self, ref: str | None = None) -> None:
        """Record the message now showing the reply (``ref``), or that all of it left. A
        store failure is only logged: the worst it costs is a second message on a retry."""
        try:
            await self.inbox.mark_sent(self.chat, f"{self.digest} {ref}" if ref else
                                       self.digest)
        except RedisError as exc:
            self.outage(exc)


def fenced_send(fence: Fence, send: Send) -> Send:
    """A one-call reply behind the fence."""
    async def fenced(text: str) -> None:
        left, _ = await fence.check()
        if left:
            return
        await send(text)
        await fence.mark()

    return fenced


class FencedLive:
    """A platform's reply behind the fence, shown while it is written (a ``LiveReply``)."""

    def __init__(self, fence: Fence, platform: PlatformReply) -> None:
        self.fence = fence
        self.platform = platform
        self.ref: str | None = None  # the message showing the reply
        self.shown: str | None = None  # what it shows, as far as this process knows

    @property
    def editing(self) -> bool:
        return self.ref is not None

    @property
    def showing(self) -> str | None:
        return self.shown

    async def typing(self) -> None:
        await self.platform.typing()  # cosmetic: no fence needed

    async def show(self, text: str) -> None:
        """Post the first text, edit the message after; a retry finds the message an
        earlier holder posted and edits that one."""
        left, ref = await self.fence.check()
        if left:
            return
        ref = ref or self.ref
        if ref is None:
            self.ref = await self.platform.post(text)
            self.shown = text
            await self.fence.mark(self.ref)
            return
        self.ref = ref
        await self._edit(ref, text)

    async def __call__(self, text: str) -> None:
        """The whole reply: the last edit of the message showing it, or one new message."""
        left, ref = await self.fence.check()
        if left:
            return
        ref = ref or self.ref
        if ref is None:
            await self.platform(text)
        else:
            await self._edit(ref, text)
        self.shown = text
        await self.fence.mark()

    async def _edit(self, ref: str, text: str) -> None:
        if text != self.shown:  # never an edit to the same text (Telegram refuses it)
            await self.platform.edit(ref, text)
            self.shown = text
