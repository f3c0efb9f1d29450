"""Conversation rows in PostgreSQL: the system of record for which conversation is active
and what was said. Every function runs on the caller's connection (and transaction).

Storing a message and storing its reply are one statement each, the PL/pgSQL functions of
``0005_conversation_functions.sql``: called outside a transaction, each commits on its own,
so the :class:`FeedRow` it returns may be published as soon as it returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from gateway.conversations.model import Incoming, chat_key
from gateway.push.protocol import FeedRow


@dataclass(frozen=True)
class Message:
    conversation_id: int
    seq: int
    role: str
    text: str
    user_id: str | None
    user_name: str | None

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "role": self.role, "text": self.text,
                "user_id": self.user_id, "user_name": self.user_name}


# A busy chat is waited for in slices of this long, each ended by the server
# (``lock_timeout``), so the pool's command timeout never cuts a wait short. The server
# decides, so a slice that ends has taken nothing: no lock is left behind by a cancel.
LOCK_SLICE_SECONDS = 10.0


async def lock_chat(conn: asyncpg.Connection, incoming: Incoming) -> None:
    """Session advisory lock on the chat: one message of a chat at a time across every
    process and replica, however long the message before it takes. Released by
    :func:`unlock_chat` (or when the session ends)."""
    name = _lock_name(incoming)
    await conn.execute(f"SET lock_timeout = '{int(LOCK_SLICE_SECONDS * 1000)}ms'")
    try:
        while True:
            try:
                await conn.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", name,
                                   timeout=LOCK_SLICE_SECONDS + 10)
                return
            except asyncpg.LockNotAvailableError:
                continue  # still busy: wait another slice
    finally:
        await conn.execute("RESET lock_timeout")


async def unlock_chat(conn: asyncpg.Connection, incoming: Incoming) -> None:
    await conn.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))",
                       _lock_name(incoming))


def _lock_name(incoming: Incoming) -> str:
    return f"conversation:{incoming.platform}:{chat_key(incoming)}"


def topic(conversation_id: int) -> str:
    """The conversation's feed topic (always valid for ``check_topic``)."""
    return f"conversation:{conversation_id}"


@dataclass(frozen=True)
class Received:
    """What storing one user message did.

    ``duplicate``: the platform message id was stored before in the active conversation
    (a redelivery), nothing was stored, ``seq`` is the stored message's and ``reply_*`` its
    reply's state. Otherwise ``row`` is the feed row of the message just stored."""

    conversation_id: int
    created: bool  # this message started the conversation (first contact or /new)
    duplicate: bool
    seq: int
    reply_seq: int | None
    reply_text: str | None
    reply_settled: bool
    row: FeedRow | None


@dataclass(frozen=True)
class Replied:
    """The stored reply; ``row`` is None when the message had been answered before (that
    answer is returned, nothing stored)."""

    seq: int
    text: str
    row: FeedRow | None


_RECEIVE = ("SELECT * FROM conversation_receive("
            "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)")
_REPLY = "SELECT * FROM conversation_reply($1, $2, $3, $4, $5, $6)"


async def receive(conn: asyncpg.Connection, incoming: Incoming, pointer: int | None,
                  is_new: bool) -> Received:
    """Store ``incoming`` in the chat's active conversation in one round trip.

    ``pointer`` is the cached conversation id (NULL or stale is fine); ``is_new`` ends the
    active conversation first (``/new``) unless this message is the chat's first."""
    record = await conn.fetchrow(
        _RECEIVE, incoming.platform, chat_key(incoming), incoming.chat, incoming.thread,
        incoming.team, pointer, incoming.message_id, incoming.user_id, incoming.user_name,
        incoming.text, is_new)
    assert record is not None
    conversation_id, seq = record["conversation_id"], record["seq"]
    row = _feed_row(record, incoming, Message(conversation_id, seq, "user", incoming.text,
                                              incoming.user_id, incoming.user_name))
    return Received(conversation_id, record["created"], record["duplicate"], seq,
                    record["reply_seq"], record["reply_text"], bool(record["reply_settled"]),
                    row)


async def reply(conn: asyncpg.Connection, incoming: Incoming, conversation_id: int,
                reply_to: int, text: str) -> Replied:
    """Store the bot's answer to message ``reply_to`` in one round trip; an answer stored
    before is returned instead (one answer per message)."""
    record = await conn.fetchrow(_REPLY, conversation_id, reply_to, text, incoming.platform,
                                 incoming.chat, incoming.thread)
    assert record is not None
    row = _feed_row(record, incoming, Message(conversation_id, record["seq"], "bot",
                                              record["text"], None, None))
    return Replied(record["seq"], record["text"], row)


def _feed_row(record: asyncpg.Record, incoming: Incoming, message: Message) -> FeedRow | None:
    """The feed row the statement appended (None when it stored nothing), its payload
    built here exactly as the SQL built it, so it is signalled without reading it back."""
    if record["feed_offset"] is None:
        return None
    return FeedRow(topic(message.conversation_id), record["feed_offset"],
                   record["feed_epoch"], "message", payload(incoming, message),
                   record["feed_created_at"])


def payload(incoming: Incoming, message: Message) -> dict[str, Any]:
    """A message's feed payload; ``conversation_append`` in the migration builds the same."""
    return {"conversation_id": message.conversation_id, "seq": message.seq,
            "role": message.role, "text": message.text, "platform": incoming.platform,
            "chat": incoming.chat, "thread": incoming.thread,
            "user_id": message.user_id, "user_name": message.user_name}


# The settle: one prepared statement whose own transaction commits without waiting for its
# WAL flush. The CTE sets synchronous_commit for this transaction only (set_config's
# is_local: in effect at its COMMIT, gone after it) before the row is written; outside a
# transaction the statement is its transaction. Prepared, it is planned once per connection
# (as a simple query with the ids in its text, BEGIN, SET LOCAL and COMMIT it was parsed and
# planned for every message); a PL/pgSQL function around it costs ~30 µs more per call, and
# a SQL one is planned per call before PostgreSQL 18.
_SETTLE = """
WITH asynchronous AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
UPDATE conversation_messages AS m SET settled_at = now() FROM asynchronous
WHERE m.conversation_id = $1 AND m.seq = $2
"""
_SETTLE_IN_TRANSACTION = ("UPDATE conversation_messages SET settled_at = now()"
                          " WHERE conversation_id = $1 AND seq = $2")


async def settle(conn: asyncpg.Connection | asyncpg.Pool, conversation_id: int,
                 seq: int) -> None:
    """The reply left our hands (delivered or dead-lettered), committed without waiting for
    its WAL flush (``synchronous_commit = off`` for this transaction only): a PostgreSQL
    crash that loses the mark leaves the reply unsettled, and a retried head is then kept
    from sending it again by the inbox fence's sent mark (docs/architecture.md, "What a
    crash can still do"). One round trip, and it leaves nothing in the session: a caller may
    skip the pool's reset after it (``GatewayConnection.leave_clean``). Inside the caller's
    own transaction the plain UPDATE runs, and that commit decides."""
    if isinstance(conn, asyncpg.Connection) and conn.is_in_transaction():
        await conn.execute(_SETTLE_IN_TRANSACTION, conversation_id, seq)
        return
    await conn.execute(_SETTLE, conversation_id, seq)


async def settled(conn: asyncpg.Connection | asyncpg.Pool, conversation_id: int,
                  seq: int) -> bool:
    """The reply ``seq`` left our hands already (``settle`` ran)."""
    return bool(await conn.fetchval(
        "SELECT settled_at IS NOT NULL FROM conversation_messages"
        " WHERE conversation_id = $1 AND seq = $2", conversation_id, seq))


async def history(conn: asyncpg.Connection | asyncpg.Pool, conversation_id: int,
                  limit: int = 20) -> list[Message]:
    """The last ``limit`` messages of a conversation, oldest first."""
    rows = await conn.fetch(
        "SELECT * FROM (SELECT seq, role, text, user_id, user_name FROM conversation_messages"
        " WHERE conversation_id = $1 ORDER BY seq DESC LIMIT $2) m ORDER BY seq",
        conversation_id, limit)
    return [Message(conversation_id, r["seq"], r["role"], r["text"], r["user_id"],
                    r["user_name"]) for r in rows]
