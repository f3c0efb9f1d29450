"""The inbox consumer: every ``gateway serve`` runs one per chat platform it serves.

It leases ready chats (up to ``max_chats`` at a time), processes each chat's entries in
order through the conversation service, and acknowledges each entry after it. Leases are
renewed together every third of their length; expired ones (a holder died or stalled) are
reclaimed by any consumer. Before every platform call of a reply the consumer checks it still
holds the chat and what of the reply left (the fence, ``fence.py``): a holder that stalled
past its lease stops instead of answering next to its successor. A store outage releases the
chat without counting against its entry, also one met while the reply is sent (the limiter's
or the fence's store: ``StoreOutage``, which the delivery loop does not count); any other
failure counts, and an entry that keeps failing ends in the dead letters.

A push in this process wakes the consumer at once; other replicas find work by polling
every ``poll_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.inbox.entry import BadEntry, Entry
from gateway.inbox.fence import Fence, FencedLive, LeaseLost, fenced_send
from gateway.inbox.queue import Inbox, Lost, Taken, new_token
from gateway.leases.maintenance import view_for
from gateway.outbound.delivery import Send
from gateway.outbound.errors import StoreOutage
from gateway.outbound.live import MAX_CHARS, PlatformReply
from gateway.stores.runtime import Runtime

log = logging.getLogger("gateway.inbox")

# The stores being unreachable is no fault of the entry: retried without counting.
OUTAGE = (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
          asyncpg.exceptions.OperatorInterventionError, asyncpg.TooManyConnectionsError,
          RedisConnectionError, RedisTimeoutError, TimeoutError, StoreOutage)

# Processes one entry; replies go through ``send``.
Process = Callable[[Entry, Send], Awaitable[None]]
# The platform call that answers an entry (a ``PlatformReply`` when the platform can edit
# it: then the reply is shown while it is written); ``retried`` when an earlier attempt at it
# failed or its holder died (a reply may have left already: an adapter that can ask the
# platform checks before sending again).
SenderFor = Callable[[Entry, bool], Send]


@dataclass(frozen=True)
class ConsumerConfig:
    max_chats: int = 32
    poll_seconds: float = 0.25
    outage_delay: float = 1.0
    failure_delay: float = 2.0
    drain_seconds: float = 10.0


class InboxConsumer:
    def __init__(self, runtime: Runtime, inbox: Inbox, sender_for: SenderFor,
                 process: Process, config: ConsumerConfig | None = None) -> None:
        self.runtime = runtime
        self.inbox = inbox
        self.sender_for = sender_for
        self.process = process
        self.config = config or ConsumerConfig()
        self.held: dict[str, str] = {}  # chat -> the token it was taken with
        self._tokens = (f"{new_token()}-{n}" for n in itertools.count(1))
        self._wake = asyncio.Event()
        self._slot = asyncio.Event()
        self._chats: set[asyncio.Task[None]] = set()
        self._outage_logged = False
        self._stopping = False

    def wake(self) -> None:
        """Work was pushed in this process: take it now rather than at the next poll."""
        self._wake.set()

    # --- the loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        maintenance = view_for(self.runtime.durable)
        renewer = asyncio.create_task(self._renew_forever())
        next_reclaim = 0.0
        try:
            while not stop.is_set():
                if (await maintenance.current()).on:  # idle; entries wait in the inbox
                    await _first(stop, self.config.poll_seconds * 4)
                    continue
                free = self.config.max_chats - len(self._chats)
                if free <= 0:
                    self._slot.clear()
                    await _first(stop, None, self._slot)
                    continue
                if time.monotonic() >= next_reclaim:
                    next_reclaim = time.monotonic() + self.inbox.limits.lease_seconds / 3
                    await self._reclaim()
                self._wake.clear()
                if not await self._take(free):
                    await _first(stop, self.config.poll_seconds, self._wake)
        finally:
            self._stopping = True
            await self._drain()
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    async def _take(self, free: int) -> bool:
        token = next(self._tokens)
        try:
            taken = await self.inbox.take(token, free)
        except RedisError as exc:
            self._outage(exc)
            return False
        self._outage_logged = False
        for item in taken:
            self.held[item.chat] = token
            task = asyncio.create_task(self._run_chat(item, token))
            self._chats.add(task)
            task.add_done_callback(self._chat_done)
        return bool(taken)

    def _chat_done(self, task: asyncio.Task[None]) -> None:
        self._chats.discard(task)
        self._slot.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("inbox %s: chat task failed", self.inbox.platform,
                      exc_info=task.exception())

    async def _reclaim(self) -> None:
        try:
            reclaimed = await self.inbox.reclaim()
        except RedisError as exc:
            self._outage(exc)
            return
        if reclaimed:
            log.warning("inbox %s: reclaimed %d chat(s) whose holder stopped renewing",
                        self.inbox.platform, reclaimed)

    async def _renew_forever(self) -> None:
        # Also ends on ``_stopping``: a cancel landing inside the Redis call may come out as
        # a connection error, which the loop swallows.
        while not self._stopping:
            await asyncio.sleep(self.inbox.limits.lease_seconds / 3)
            held = dict(self.held)
            try:
                lost = await self.inbox.renew(held)
            except RedisError as exc:
                self._outage(exc)
                continue
            for chat in lost:
                log.warning("inbox %s: lease of a chat lost; its next holder goes on",
                            self.inbox.platform)
                if self.held.get(chat) == held[chat]:  # not retaken here meanwhile
                    del self.held[chat]

    async def _drain(self) -> None:
        """Let chats in flight finish the entry in hand (bounded), then cancel and give them
        back: what is left waits in the inbox for the next holder."""
        if self._chats:
            await asyncio.wait(set(self._chats), timeout=self.config.drain_seconds)
        # Taken before the cancel: a cancelled chat forgets its lease on the way out, and
        # would otherwise wait for it to expire before anyone took it again.
        held = dict(self.held)
        for task in set(self._chats):
            task.cancel()
        if self._chats:
            await asyncio.wait(set(self._chats), timeout=1.0)
        for chat, token in {**held, **self.held}.items():
            with contextlib.suppress(RedisError):
                await self.inbox.release(chat, token, delay=0, counted=False)
        self.held.clear()

    def _outage(self, exc: Exception) -> None:
        if not self._outage_logged:  # once per outage: the log stays bounded
            log.warning("inbox %s: redis-durable unreachable (%s); retrying",
                        self.inbox.platform, type(exc).__name__)
            self._outage_logged = True

    # --- one chat ----------------------------------------------------------------------

    async def _run_chat(self, item: Taken, token: str) -> None:
        chat, head, retried = item.chat, item.head, item.attempts > 0
        try:
            while head:
                if self._stopping:  # the rest waits, durable, for the next holder
                    await self._release(chat, token, 0, counted=False)
                    return
                if not await self._process_head(chat, token, head, retried):
                    return
                retried = False
                try:
                    following = await self.inbox.ack(chat, token, head)
                except RedisError as exc:  # the lease expires; the reclaim re-runs the head
                    self._outage(exc)
                    return
                if following is Lost.LEASE or following is None:
                    return
                head = following
        finally:
            if self.held.get(chat) == token:
                del self.held[chat]

    async def _process_head(self, chat: str, token: str, head: str, retried: bool) -> bool:
        """Process the chat's head entry; False when the chat was given back (or lost)."""
        try:
            entry = Entry.decode(head)
        except BadEntry as exc:
            log.error("inbox %s: dead-lettering an entry: %s", self.inbox.platform, exc)
            await self._release(chat, token, 0, counted=True, at_once=True)
            return False
        try:
            await self.process(entry, self._fenced(chat, token, head,
                                                   self.sender_for(entry, retried)))
        except LeaseLost:
            return False
        except OUTAGE as exc:
            self._outage(exc)
            await self._release(chat, token, self.config.outage_delay, counted=False)
            return False
        except Exception:
            log.exception("inbox %s: processing an entry failed; it will be retried",
                          self.inbox.platform)
            await self._release(chat, token, self.config.failure_delay, counted=True)
            return False
        return True

    def _fenced(self, chat: str, token: str, head: str, send: Send) -> Send:
        """``send`` behind the fence (``fence.py``): nothing is sent by a holder that lost
        the chat, nor again once the head's reply left; a platform reply that can be edited
        becomes a live one, which a retry resumes in the message it showed."""
        fence = Fence(self.inbox, chat, token, head, self._outage)
        if isinstance(send, PlatformReply):
            return FencedLive(fence, send, MAX_CHARS.get(self.inbox.platform, 4096))
        return fenced_send(fence, send)

    async def _release(self, chat: str, token: str, delay: float, *, counted: bool,
                       at_once: bool = False) -> None:
        try:
            dead = await self.inbox.release(chat, token, delay=delay, counted=counted,
                                            at_once=at_once)
        except RedisError as exc:  # the lease expires and the chat is reclaimed
            self._outage(exc)
            return
        if dead:
            log.error("inbox %s: an entry failed too often and is now a dead letter",
                      self.inbox.platform)


async def _first(stop: asyncio.Event, timeout: float | None, *events: asyncio.Event) -> None:
    """Wait until ``stop`` or one of ``events`` is set, or ``timeout`` passes."""
    waiters = [asyncio.ensure_future(e.wait()) for e in (stop, *events)]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
