"""Conversation rows in PostgreSQL: the system of record for which conversation is active
and what was said. Every function runs on the caller's connection (and transaction)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from gateway.conversations.model import Incoming, chat_key


@dataclass(frozen=True)
class Conversation:
    id: int
    message_count: int


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


async def active_by_id(conn: asyncpg.Connection, conversation_id: int) -> Conversation | None:
    """The conversation a cache pointer names, if it is still the active one."""
    row = await conn.fetchrow(
        "SELECT id, message_count FROM conversations WHERE id = $1 AND active FOR UPDATE",
        conversation_id)
    return Conversation(row["id"], row["message_count"]) if row else None


async def active_for_chat(conn: asyncpg.Connection, incoming: Incoming) -> Conversation | None:
    row = await conn.fetchrow(
        "SELECT id, message_count FROM conversations"
        " WHERE platform = $1 AND chat_key = $2 AND active FOR UPDATE",
        incoming.platform, chat_key(incoming))
    return Conversation(row["id"], row["message_count"]) if row else None


async def start(conn: asyncpg.Connection, incoming: Incoming) -> Conversation:
    """End the chat's active conversation (if any) and start a new one (``/new``)."""
    await conn.execute(
        "UPDATE conversations SET active = false, ended_at = now()"
        " WHERE platform = $1 AND chat_key = $2 AND active",
        incoming.platform, chat_key(incoming))
    row = await conn.fetchrow(
        "INSERT INTO conversations (platform, chat_key, chat, thread, team)"
        " VALUES ($1, $2, $3, $4, $5) RETURNING id, message_count",
        incoming.platform, chat_key(incoming), incoming.chat, incoming.thread, incoming.team)
    assert row is not None
    return Conversation(row["id"], row["message_count"])


@dataclass(frozen=True)
class Inbound:
    """A user message stored before (a redelivery) and the state of its reply."""

    seq: int
    reply_seq: int | None
    reply_text: str | None
    reply_settled: bool


async def find_inbound(conn: asyncpg.Connection, conversation_id: int,
                       message_id: str) -> Inbound | None:
    row = await conn.fetchrow(
        "SELECT m.seq, r.seq AS reply_seq, r.text AS reply_text,"
        " r.settled_at IS NOT NULL AS settled"
        " FROM conversation_messages m LEFT JOIN conversation_messages r"
        "   ON r.conversation_id = m.conversation_id AND r.role = 'bot' AND r.reply_to = m.seq"
        " WHERE m.conversation_id = $1 AND m.role = 'user' AND m.platform_message_id = $2",
        conversation_id, message_id)
    if row is None:
        return None
    return Inbound(row["seq"], row["reply_seq"], row["reply_text"], bool(row["settled"]))


async def settle(conn: asyncpg.Connection | asyncpg.Pool, conversation_id: int,
                 seq: int) -> None:
    """The reply left our hands (delivered or dead-lettered)."""
    await conn.execute(
        "UPDATE conversation_messages SET settled_at = now()"
        " WHERE conversation_id = $1 AND seq = $2", conversation_id, seq)


async def add_message(conn: asyncpg.Connection, conversation: Conversation, *, role: str,
                      text: str, platform_message_id: str | None = None,
                      reply_to: int | None = None, user_id: str | None = None,
                      user_name: str | None = None) -> Message:
    """Append a message as the conversation's next seq (the caller holds the chat lock and
    the conversation row)."""
    seq = await conn.fetchval(
        "UPDATE conversations SET message_count = message_count + 1, last_message_at = now()"
        " WHERE id = $1 RETURNING message_count", conversation.id)
    await conn.execute(
        "INSERT INTO conversation_messages (conversation_id, seq, role, platform_message_id,"
        " reply_to, user_id, user_name, text) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        conversation.id, seq, role, platform_message_id, reply_to, user_id, user_name, text)
    return Message(conversation.id, seq, role, text, user_id, user_name)


async def history(conn: asyncpg.Connection | asyncpg.Pool, conversation_id: int,
                  limit: int = 20) -> list[Message]:
    """The last ``limit`` messages of a conversation, oldest first."""
    rows = await conn.fetch(
        "SELECT * FROM (SELECT seq, role, text, user_id, user_name FROM conversation_messages"
        " WHERE conversation_id = $1 ORDER BY seq DESC LIMIT $2) m ORDER BY seq",
        conversation_id, limit)
    return [Message(conversation_id, r["seq"], r["role"], r["text"], r["user_id"],
                    r["user_name"]) for r in rows]
