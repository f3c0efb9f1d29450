"""Linking a chat to an account: the account asks for a code (``POST /v1/auth/link-code``),
the user sends ``/link <code>`` in the chat (``/gw link <code>`` on Slack; ``link <code>`` on
Mattermost, whose clients take a leading ``/`` as a slash command of their own: see
``bare_link``), and from then on that account may read the chat's ``conversation:<id>``
topics, present and future.

A code is drawn at random among 10^8 and a pending one is never reassigned (a draw that
hits one draws again), and an account may ask for ``[access] link_codes_per_hour`` (20) codes
(``rl:``, in ``gateway.web.auth``), so nobody can fill the space or take another's code.
Wrong codes count per chat in ``brute:`` (5 in 10 minutes, then 15 minutes of polite
refusals), so a chat cannot walk the 10^8 codes. The ``/link`` message itself is answered
but never stored: its code must not reach the conversation or its feed."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from gateway import keys
from gateway.conversations.model import Incoming, chat_key
from gateway.stores.redis import AnyRedis

CODE_SECONDS = 600
DRAWS = 5  # a draw hits a pending code with odds (pending codes / 10^8): five never all do
MAX_WRONG = 5
WRONG_WINDOW = 600
BLOCK_SECONDS = 900

LINKED = "This chat is now linked to your account: its conversations show up there."
WRONG = "That code is not valid (or it has expired). Ask for a new one and send /link <code>."
BLOCKED = "Too many wrong codes from this chat; please try again in 15 minutes."
USAGE = "Send /link <code> with the 8-digit code your account gave you."
# How the command is written on each platform (WRONG and USAGE name the Telegram form).
_FORMS = {"slack": "/gw link <code>", "mattermost": "link <code>"}


def _for(platform: str, text: str) -> str:
    return text.replace("/link <code>", _FORMS.get(platform, "/link <code>"))


_BARE_LINK = re.compile(r"\s*link\s+(\d{8})\s*", re.IGNORECASE)


def bare_link(text: str) -> str:
    """``link <8-digit code>`` as the ``/link <code>`` command, any other text as it is.
    For Mattermost, whose clients treat a message starting with ``/`` as one of their own
    slash commands (an unknown one is refused there, never posted); ``/link <code>`` still
    works for messages posted through its API. Only the exact form: "link me to the docs"
    stays a message."""
    match = _BARE_LINK.fullmatch(text)
    return f"/link {match.group(1)}" if match else text


def _hash(code: str) -> bytes:
    return hashlib.sha256(code.encode()).digest()


class NoFreeCode(Exception):
    """Every code drawn was pending for another request (a 503: try again)."""


async def new_code(pool: asyncpg.Pool, sub: str,
                   topics: Sequence[str] = ()) -> dict[str, Any]:
    """A fresh code for ``sub``. A pending code is never handed to anyone else: a draw that
    hits one (used or expired codes may be drawn again) draws anew, ``DRAWS`` times at most.
    ``topics``: the patterns of the credential asking, which the linked chat may then
    subscribe to (``/subscribe``)."""
    for _ in range(DRAWS):
        code = f"{secrets.randbelow(10**8):08d}"
        taken = await pool.fetchval(
            "INSERT INTO link_codes (code_hash, sub, expires_at, topics) VALUES"
            f" ($1, $2, now() + interval '{CODE_SECONDS} seconds', $3)"
            " ON CONFLICT (code_hash) DO UPDATE SET sub = EXCLUDED.sub,"
            " expires_at = EXCLUDED.expires_at, used_at = NULL, topics = EXCLUDED.topics"
            " WHERE link_codes.used_at IS NOT NULL OR link_codes.expires_at <= now()"
            " RETURNING true", _hash(code), sub, list(topics))
        if taken:
            return {"code": code, "expires_in": CODE_SECONDS}
    raise NoFreeCode(f"no free link code in {DRAWS} draws")


def _barrier_keys(incoming: Incoming) -> tuple[str, str]:
    chat = f"{{link:{incoming.platform}:{chat_key(incoming)}}}"
    return keys.brute(chat, "fail"), keys.brute(chat, "block")


async def link(conn: asyncpg.Connection, durable: AnyRedis, incoming: Incoming) -> str:
    """Answer a ``/link <code>`` message: the reply text. Runs on the connection the message
    already holds (a second one from the pool could wait forever when it is full)."""
    words = incoming.text.split()
    fail_key, block_key = _barrier_keys(incoming)
    if await durable.exists(block_key):
        return BLOCKED
    if len(words) != 2 or not (words[1].isdigit() and len(words[1]) == 8):
        return _for(incoming.platform, USAGE)
    async with conn.transaction():
        code = await conn.fetchrow(
            "UPDATE link_codes SET used_at = now() WHERE code_hash = $1 AND used_at IS NULL"
            " AND expires_at > now() RETURNING sub, topics", _hash(words[1]))
        sub = None if code is None else code["sub"]
        if code is not None:  # linked again: what it may subscribe to is the new code's
            await conn.execute(
                "INSERT INTO chat_links (sub, platform, chat_key, topics)"
                " VALUES ($1, $2, $3, $4) ON CONFLICT (sub, platform, chat_key)"
                " DO UPDATE SET topics = EXCLUDED.topics",
                sub, incoming.platform, chat_key(incoming), code["topics"])
    if sub is not None:
        return LINKED
    async with durable.pipeline(transaction=True) as pipe:
        pipe.incr(fail_key)
        pipe.expire(fail_key, WRONG_WINDOW, nx=True)
        wrong, _ = await pipe.execute()
    if int(wrong) >= MAX_WRONG:
        await durable.set(block_key, "1", ex=BLOCK_SECONDS)
        await durable.delete(fail_key)
        return BLOCKED
    return _for(incoming.platform, WRONG)


@dataclass(frozen=True)
class Link:
    id: int
    platform: str
    chat_key: str
    created_at: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "platform": self.platform, "chat": self.chat_key,
                "created_at": self.created_at}


async def links_of(pool: asyncpg.Pool, sub: str) -> list[Link]:
    rows = await pool.fetch("SELECT id, platform, chat_key, created_at FROM chat_links"
                            " WHERE sub = $1 ORDER BY id", sub)
    return [Link(r["id"], r["platform"], r["chat_key"], r["created_at"].isoformat())
            for r in rows]


async def unlink(pool: asyncpg.Pool, sub: str, link_id: int) -> bool:
    status = await pool.execute("DELETE FROM chat_links WHERE id = $1 AND sub = $2",
                                link_id, sub)
    return status == "DELETE 1"


async def linked_conversations(pool: asyncpg.Pool, sub: str,
                               conversation_ids: list[int]) -> set[int]:
    """Which of these conversations belong to chats linked to ``sub``."""
    rows = await pool.fetch(
        "SELECT c.id FROM conversations c JOIN chat_links l"
        " ON l.platform = c.platform AND l.chat_key = c.chat_key"
        " WHERE l.sub = $1 AND c.id = ANY($2::bigint[])", sub, conversation_ids)
    return {r["id"] for r in rows}


# Where a chat's id sits in its chat key, per platform (``model.chat_key``).
_CHAT_IN_KEY = {"telegram": "chat_key", "slack": "split_part(chat_key, '/', 2)",
                "mattermost": "split_part(chat_key, '/', 1)"}


async def linked_chat(pool: asyncpg.Pool, sub: str, platform: str, chat: str) -> bool:
    """Is the chat (a Telegram chat, a Slack or Mattermost channel) linked to ``sub``?"""
    column = _CHAT_IN_KEY.get(platform)
    if column is None:
        return False
    return bool(await pool.fetchval(
        f"SELECT EXISTS (SELECT 1 FROM chat_links WHERE sub = $1 AND platform = $2"
        f" AND {column} = $3)", sub, platform, chat))
