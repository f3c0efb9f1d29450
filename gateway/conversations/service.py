"""The conversation service: ``handle_leased`` for the inbox consumers, ``handle_incoming``
for any other caller.

Per message, one chat at a time (the inbox consumer's chat lease; or, for other callers, an
in-process FIFO lock then a PostgreSQL advisory lock so several processes take turns on one
chat), in one statement (``store.receive``,
its own transaction): find the active conversation (redis-cache pointer, else PostgreSQL,
else a new one), store the message and its feed row; publish after it, run the configured
handler, store the reply and its feed row (``store.reply``, one statement too), then deliver
it through ``send`` behind the platform's rate limits, with retries and a dead letter. A
handler that answers with a stream has it shown while it is written when ``send`` is a live
reply (``gateway.outbound.live``: typing, one message, edits), and its whole text is then
stored and delivered the same way (the last edit). The lock is held until the reply left,
so replies keep the messages' order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg

from gateway.config import Settings
from gateway.conversations import links, store, subscribing
from gateway.conversations.handlers import Context, Handler, Reply, load_handler
from gateway.conversations.llm import LlmHandler
from gateway.conversations.locks import KeyedLocks
from gateway.conversations.model import Incoming, chat_key, command_of, pointer_key
from gateway.outbound import live
from gateway.outbound.delivery import RetryPolicy, Send, deliver, limit_names
from gateway.push import feed
from gateway.push.protocol import FeedRow
from gateway.ratelimit import Limiter, Providers, platform_limits, provider_limits
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.postgres import leave_clean
from gateway.stores.runtime import Runtime, chat_pipeline

__all__ = ["ConversationService", "Incoming", "handle_incoming", "service_for"]

log = logging.getLogger("gateway.conversations")

DEFAULT_IDLE_SECONDS = 7 * 86400
RESERVED_CONNECTIONS = 2
APOLOGY = "Sorry, I could not answer that just now. Please try again."


@dataclass(frozen=True)
class Outcome:
    """What one call did (for tests and logs)."""

    conversation_id: int
    seq: int
    reply: str | None
    delivered: bool
    duplicate: bool = False


class ConversationService:
    """One per runtime: the handler, the limiter and the per-chat locks of this process."""

    def __init__(self, runtime: Runtime, handler: Handler | None = None) -> None:
        settings = runtime.settings
        section = settings.section("conversations")
        self.runtime = runtime
        self.handler = handler or handler_for(settings)
        # The platform limits of concurrent replies share round trips with each other and
        # with the inbox's commands (a reply's buckets are asked in one: ``delivery.admit``).
        self.limiter = Limiter(runtime.durable, chat_pipeline(runtime))
        self.providers = Providers(self.limiter, provider_limits(settings))
        self.limits = platform_limits(settings)
        self.policy = RetryPolicy.from_settings(settings)
        self.idle_seconds = int(section.get("idle_seconds", DEFAULT_IDLE_SECONDS))
        # A streamed reply: at most one edit per edit_interval (and the platform's limits),
        # the typing indicator renewed every typing_interval until the first words.
        self.edit_interval = float(section.get("edit_interval", 1.0))
        self.typing_interval = float(section.get("typing_interval", 4.0))
        self.locks = KeyedLocks()
        # Pointer reads and writes of concurrent chats share round trips and connections.
        self.cache = AutoPipeline(runtime.cache)
        # A chat in flight holds a pooled connection until its reply has left, which can
        # include a platform's Retry-After. Leave RESERVED connections to the rest of the
        # process (feed reads, journal writes) however many chats are waiting.
        pool_size = runtime.pg.get_max_size()
        self.in_flight = asyncio.Semaphore(int(section.get(
            "max_chats_in_flight", max(1, pool_size - RESERVED_CONNECTIONS))))

    async def handle_leased(self, incoming: Incoming, send: Send) -> Outcome:
        """Handle a message whose chat the caller holds exclusively across every process
        (an inbox lease, fenced before each send): no chat lock of our own is needed."""
        async with self.in_flight, self.runtime.pg.acquire() as conn:
            return await self._handle_locked(conn, incoming, send, last=True)

    async def handle(self, incoming: Incoming, send: Send) -> Outcome:
        async with self.locks.hold(f"{incoming.platform}:{chat_key(incoming)}"), \
                self.in_flight:
            async with self.runtime.pg.acquire() as conn:
                await store.lock_chat(conn, incoming)
                try:
                    return await self._handle_locked(conn, incoming, send)
                finally:
                    # If this fails the connection is broken; its session (and lock) ends.
                    with contextlib.suppress(Exception):
                        await store.unlock_chat(conn, incoming)

    async def _handle_locked(self, conn: asyncpg.Connection, incoming: Incoming,
                             send: Send, *, last: bool = False) -> Outcome:
        """``last``: the connection goes back to the pool right after, fresh from it when
        acquired: the pool's reset is skipped after the settle, the last statement, since
        none of this message's statements leaves anything in the session."""
        command = command_of(incoming.text)
        # Answered, never stored: a link code must not reach the feed, and a chat's
        # subscription commands are for the gateway, not the conversation.
        if command == "link" or command in subscribing.COMMANDS:
            answer_text = (await links.link(conn, self.runtime.durable, incoming)
                           if command == "link" else
                           await subscribing.answer(conn, self.runtime, incoming))
            delivered = await deliver(conn, self.limiter, limit_names(incoming, self.limits),
                                      incoming, answer_text, send, self.policy)
            return Outcome(0, 0, answer_text, delivered)
        received = await self._receive(conn, incoming, command)
        if received.duplicate and received.reply_seq is not None:
            return await self._redelivered(conn, incoming, send, received, last)
        # New, or stored before but never answered (the process died): run the handler.
        conversation_id, seq = received.conversation_id, received.seq
        answered = await self._run_handler(conn, incoming, conversation_id, seq, command,
                                           received.created)
        if answered is None:
            return Outcome(conversation_id, seq, None, False)
        reply = answered if isinstance(answered, str) else await self._written(
            incoming, send, answered)
        answer = await store.reply(conn, incoming, conversation_id, seq, reply)
        if answer.row is None:
            # Answered meanwhile by a holder that lost the chat while its handler ran: it
            # stored its reply, then met the fence. That reply is the answer, and this
            # holder sends it unless it left already (settled; the fence's sent mark and
            # the adapter's look-before-retry keep it to one message).
            log.warning("%s %s: message %s of conversation %s was answered already",
                        incoming.platform, incoming.chat, seq, conversation_id)
            return await self._send_stored(
                conn, incoming, send, conversation_id, seq, answer.seq, answer.text,
                await store.settled(conn, conversation_id, answer.seq), last)
        if not self._signal(answer.row):
            await self._publish(answer.row)
        delivered = await self._deliver(conn, incoming, send, conversation_id, answer.seq,
                                        reply, last)
        return Outcome(conversation_id, seq, reply, delivered)

    async def receive_leased(self, incoming: Incoming) -> store.Received:
        """Only store the message (and signal it), as ``handle_leased`` does first: what
        the benchmarks time as arrival to stored."""
        async with self.in_flight, self.runtime.pg.acquire() as conn:
            return await self._receive(conn, incoming, command_of(incoming.text))

    async def _receive(self, conn: asyncpg.Connection, incoming: Incoming,
                       command: str | None) -> store.Received:
        """Store the message and its feed row (one statement), then the push signal and, when
        it changed, the pointer to redis-cache (``self.cache``; only the pointer is waited for)."""
        pointer = await self._read_pointer(incoming)
        received = await store.receive(conn, incoming, pointer, is_new=command == "new")
        writes = []
        if received.conversation_id != pointer:  # the read renewed an unchanged pointer
            writes.append(self._write_pointer(incoming, received.conversation_id))
        # Committed (the statement was its own transaction): signalled with the next flush.
        if received.row is not None and not self._signal(received.row):
            writes.append(self._publish(received.row))
        if len(writes) == 1:  # the usual case: awaited as is, without gather's task
            await writes[0]
        elif writes:
            await asyncio.gather(*writes)
        return received

    def _signal(self, row: FeedRow) -> bool:
        """Queue the committed row's signal on ``self.cache`` without waiting for it (it is
        at-most-once, and nothing here depends on it); False when it must be awaited
        (``_publish``: a cluster's coalescer cannot route PUBLISH)."""
        return feed.publish_soon(self.runtime.cache, [row], self.cache)

    async def _publish(self, row: FeedRow) -> None:
        await feed.publish(self.runtime.cache, row, self.cache)

    async def _redelivered(self, conn: asyncpg.Connection, incoming: Incoming, send: Send,
                           seen: store.Received, last: bool) -> Outcome:
        """The platform sent a message we stored and answered before: at most once."""
        if seen.reply_seq is None or seen.reply_text is None:
            return Outcome(seen.conversation_id, seen.seq, seen.reply_text, False,
                           duplicate=True)
        return await self._send_stored(conn, incoming, send, seen.conversation_id, seen.seq,
                                       seen.reply_seq, seen.reply_text, seen.reply_settled,
                                       last)

    async def _send_stored(self, conn: asyncpg.Connection, incoming: Incoming, send: Send,
                           conversation_id: int, seq: int, reply_seq: int, text: str,
                           settled: bool, last: bool) -> Outcome:
        """A reply stored before: sent now unless it left our hands already (``settled``:
        delivered or dead-lettered); its holder died, or lost the chat, in between."""
        delivered = False
        if not settled:
            delivered = await self._deliver(conn, incoming, send, conversation_id, reply_seq,
                                            text, last)
        return Outcome(conversation_id, seq, text, delivered, duplicate=True)

    async def _written(self, incoming: Incoming, send: Send,
                       deltas: AsyncIterator[str]) -> str:
        """A reply handed over as it is written: shown live (typing, one message, edits)
        when the destination can be edited, else collected; the whole text either way,
        delivered after it is stored, like any reply."""
        if not live.is_live(send):
            return await live.collect(deltas, APOLOGY)
        bot = f"{incoming.platform}:bot"
        pace = live.Pace(self.limiter, limit_names(incoming, self.limits, edit=True),
                         [(n, r) for n, r in limit_names(incoming, self.limits) if n == bot],
                         self.edit_interval, self.typing_interval)
        return await live.write_live(deltas, send, pace, APOLOGY)

    async def _deliver(self, conn: asyncpg.Connection, incoming: Incoming, send: Send,
                       conversation_id: int, seq: int, text: str, last: bool) -> bool:
        # Everything below runs on the connection this message already holds: asking the
        # pool for a second one could wait forever once every connection is a waiting chat.
        shown = text
        limits = limit_names(incoming, self.limits)
        if not live.is_live(send):  # one message, however long the text
            shown = live.fit(text, live.MAX_CHARS.get(incoming.platform, len(text)))
        elif send.editing:  # the last edit of a stream, or no platform call at all when
            # the messages show the whole text already
            limits = [] if send.showing == text else limit_names(incoming, self.limits,
                                                                 edit=True)
        delivered = await deliver(conn, self.limiter, limits,
                                  incoming, shown, send, self.policy,
                                  conversation_id=conversation_id, seq=seq)
        await store.settle(conn, conversation_id, seq)
        if last:
            leave_clean(conn)
        return delivered

    async def _run_handler(self, conn: asyncpg.Connection, incoming: Incoming,
                           conversation_id: int, count: int, command: str | None,
                           created: bool) -> Reply:
        async def history(limit: int) -> list[store.Message]:
            return await store.history(conn, conversation_id, limit)

        context = Context(self.runtime, incoming, conversation_id, count, command, created,
                          self.providers, history)
        try:
            return await self.handler(context)
        except Exception:
            log.exception("%s %s: conversation handler failed; answering with an apology",
                          incoming.platform, incoming.chat)
            return APOLOGY

    async def _read_pointer(self, incoming: Incoming) -> int | None:
        """The cached pointer, its TTL renewed as it is read (sliding: every message renews
        it; a pointer that turns out stale is rewritten after); a missing or unreadable
        cache just means asking PostgreSQL."""
        try:
            value = await self.cache.execute("GETEX", pointer_key(incoming),
                                             "EX", self.idle_seconds)
            return int(value) if value is not None else None
        except Exception as exc:
            log.warning("conversation pointer unreadable (%s); using PostgreSQL",
                        type(exc).__name__)
            return None

    async def _write_pointer(self, incoming: Incoming, conversation_id: int) -> None:
        """Set the pointer with a fresh TTL."""
        try:
            await self.cache.execute("SET", pointer_key(incoming), str(conversation_id),
                                     "EX", self.idle_seconds)
        except Exception as exc:
            log.warning("conversation pointer not written (%s)", type(exc).__name__)


def handler_for(settings: Settings) -> Handler:
    """The configured handler: ``llm`` (a model's streamed reply), else what
    ``load_handler`` knows."""
    if settings.section("conversations").get("handler") == "llm":
        return LlmHandler(settings)
    return load_handler(settings)


_SERVICE_ATTR = "_conversation_service"


def service_for(runtime: Runtime) -> ConversationService:
    """The runtime's service, built on first use from its settings."""
    service = getattr(runtime, _SERVICE_ATTR, None)
    if service is None:
        service = ConversationService(runtime)
        setattr(runtime, _SERVICE_ATTR, service)
    return service


async def handle_incoming(runtime: Runtime, incoming: Incoming, send: Send) -> None:
    """Handle one inbound message and deliver the reply through ``send``.

    ``send(text)`` must make ONE platform call and raise on failure: this function applies
    the platform rate limits before each call, retries a 429 after its
    Retry-After (raise ``gateway.outbound.errors.RetryLater`` or let the platform error
    through), retries other errors with backoff and dead-letters the reply in the
    ``undelivered_replies`` table after the last attempt. It returns once the reply is
    delivered or dead-lettered: mark the inbound dedup claim done then. It raises when the
    message could not be stored, or (``StoreOutage``) when redis-durable was out of reach as
    the reply was sent: release the claim, the platform's retry sends the stored reply.
    """
    await service_for(runtime).handle(incoming, send)
