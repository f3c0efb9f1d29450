"""The consumer's fence around every platform call that answers a chat's head entry.

Before each call it checks, in one round trip, that the chat is still ours (a holder that
stalled past its lease stops instead of answering next to its successor: ``LeaseLost``) and
what of the head's reply left already, which ``inbox:{inbox}:<platform>:sent`` records
per chat until the head is acknowledged:

- ``<digest>``: the whole reply left; a retry of the head sends nothing.
- ``<digest> <message id> ...``: a reply being written shows in those messages (one, or
  more for a text longer than one message holds); a retry edits the same messages (from the
  start of its own text) instead of posting new ones.

The digest names the head entry, so a record never applies to the next message.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import RedisError

from gateway.inbox.queue import Inbox
from gateway.outbound.delivery import Send
from gateway.outbound.errors import StoreOutage
from gateway.outbound.live import PlatformReply, pieces
from gateway.stores.redis import UNREACHABLE

log = logging.getLogger("gateway.inbox")


class LeaseLost(BaseException):
    """The chat's lease is someone else's now. A ``BaseException`` so that the delivery loop
    (which retries and dead-letters any ``Exception``) lets it through: we simply stop."""


class Fence:
    def __init__(self, inbox: Inbox, chat: str, token: str, head: str,
                 outage: Callable[[Exception], None]) -> None:
        self.inbox, self.chat, self.token, self.outage = inbox, chat, token, outage
        self.digest = hashlib.blake2b(head.encode(), digest_size=12).hexdigest()

    async def check(self, asked: asyncio.Future[list[Any]] | None = None
                    ) -> tuple[bool, list[str]]:
        """(the whole reply left, the messages showing it so far); raises ``LeaseLost``, or
        ``StoreOutage`` when redis-durable cannot be asked. ``asked``: the question queued
        ahead (``ask``), else it is asked now."""
        try:
            holds, sent = await self.inbox.before_send(self.chat, self.token, asked)
        except UNREACHABLE as exc:  # not the reply's fault: the chat is given back uncounted
            raise StoreOutage(f"inbox fence: {type(exc).__name__}") from exc
        if not holds:
            raise LeaseLost(self.chat)
        if sent == self.digest:
            return True, []
        digest, _, refs = sent.partition(" ")
        return False, refs.split() if digest == self.digest else []

    def ask(self) -> asyncio.Future[list[Any]]:
        """Queue ``check``'s question now (``Inbox.before_send_soon``); ``check`` reads its
        answer. A failure of its round trip waits in the future for ``check`` to raise it."""
        asked = self.inbox.before_send_soon(self.chat)
        asked.add_done_callback(_retrieved)  # one asked again instead is never read
        return asked

    async def mark(self, refs: Sequence[str] = ()) -> None:
        """Record the messages now showing the reply (``refs``), or that all of it left. A
        store failure is only logged: the worst it costs is a second message on a retry."""
        try:
            await self.inbox.mark_sent(self.chat, " ".join([self.digest, *refs]))
        except RedisError as exc:
            self.outage(exc)


    def mark_sent(self) -> None:
        """``mark()`` for the whole reply, without waiting for Redis: the HSET is queued on
        the inbox's coalescer before anything the consumer queues after the send (the head's
        ACK, which forgets it), so it is in Redis before the ACK is, as when awaited; waiting
        for it bought nothing but a round trip. A failure is reported when the reply comes,
        as ``mark`` reports it."""
        try:
            sent = self.inbox.mark_sent_soon(self.chat, self.digest)
        except RedisError as exc:
            self.outage(exc)
            return
        sent.add_done_callback(self._marked)

    def _marked(self, sent: asyncio.Future[list[Any]]) -> None:
        try:
            (reply,) = sent.result()
            if isinstance(reply, Exception):
                raise reply
        except RedisError as exc:
            self.outage(exc)
        except (Exception, asyncio.CancelledError):
            log.exception("inbox fence: the sent mark of %s failed", self.chat)


def _retrieved(future: asyncio.Future[list[Any]]) -> None:
    if not future.cancelled():
        future.exception()  # read: asyncio logs none as "never retrieved"


class FencedSend:
    """A one-call reply behind the fence. ``prepare`` (called by ``delivery.deliver`` right
    before it asks the limiter) queues the fence's question then, so that it shares the
    limiter's round trip: the check is as close to the platform call as when asked after
    the limiter (closer by that round trip); a limiter that made the send wait has it asked
    again."""

    def __init__(self, fence: Fence, send: Send) -> None:
        self.fence = fence
        self.send = send
        self._asked: asyncio.Future[list[Any]] | None = None

    def prepare(self) -> None:
        self._asked = self.fence.ask()

    async def __call__(self, text: str) -> None:
        asked, self._asked = self._asked, None  # each answer is read by one call at most
        left, _ = await self.fence.check(asked)
        if left:
            return
        await self.send(text)
        self.fence.mark_sent()


def fenced_send(fence: Fence, send: Send) -> Send:
    """A one-call reply behind the fence."""
    return FencedSend(fence, send)


class FencedLive:
    """A platform's reply behind the fence (a ``LiveReply``): shown while it is written, in
    one message, or in as many as its length takes (``pieces``), each posted once and then
    only edited."""

    def __init__(self, fence: Fence, platform: PlatformReply, max_chars: int) -> None:
        self.fence = fence
        self.platform = platform
        self.max_chars = max_chars
        self.refs: list[str] = []  # the messages showing the reply, in order
        self.shown: list[str | None] = []  # what each shows, as far as this process knows

    @property
    def editing(self) -> bool:
        return bool(self.refs)

    @property
    def showing(self) -> str | None:
        known = [text for text in self.shown if text is not None]
        return "".join(known) if self.refs and len(known) == len(self.shown) else None

    async def typing(self) -> None:
        await self.platform.typing()  # cosmetic: no fence needed

    async def show(self, text: str) -> None:
        """The text so far: the first words posted, the messages edited after; a retry
        edits the messages an earlier holder posted (found in the fence's record)."""
        if not await self._resumed():
            await self._write(text, whole=False)

    async def __call__(self, text: str) -> None:
        """The whole reply: the last edits of the messages showing it, new ones for the
        rest (one new message when nothing was shown)."""
        if not await self._resumed():
            await self._write(text, whole=True)
            self.fence.mark_sent()

    async def _resumed(self) -> bool:
        """Check the fence; True when the whole reply left already."""
        left, refs = await self.fence.check()
        if not self.refs and refs:  # posted by an earlier holder: what they show is unknown
            self.refs, self.shown = refs, [None] * len(refs)
        return left

    async def _write(self, text: str, whole: bool) -> None:
        parts = pieces(text, self.max_chars)
        for index, part in enumerate(parts):
            if not part.strip():  # nothing to show in it (yet)
                break
            if index < len(self.refs):
                if part != self.shown[index]:  # never an edit to the same text
                    await self.platform.edit(self.refs[index], part)
                    self.shown[index] = part
                continue
            self.refs.append(await self.platform.post(part, first=index == 0))
            self.shown.append(part)
            if not (whole and index == len(parts) - 1):  # (the whole reply is marked next)
                await self.fence.mark(self.refs)
