"""A chat subscribes itself: ``/subscribe <topic>``, ``/unsubscribe <topic>``,
``/subscriptions`` (Slack: ``/gw subscribe <topic>`` ...; Mattermost also without the slash,
whose clients take a leading ``/`` as a slash command of their own).

Only a linked chat may (``/link <code>``), and only to topics its linked account may read:
the topic patterns of the credential that asked for the link code, kept with the link. The
subscription belongs to that account (``u.<hash of sub>``), so the account sees it in ``GET
/v1/subscriptions`` and the per-credential limit counts it. An unlinked chat is told how to
link. The commands are answered, not stored, as ``/link`` is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import asyncpg

from gateway import keys
from gateway.conversations.links import bare_link
from gateway.conversations.model import Incoming, chat_key, command_of
from gateway.notifications import store
from gateway.notifications.settings import NotificationSettings
from gateway.notifications.subscriptions import CHAT_FIELDS, Invalid, Request, check_pattern
from gateway.push.protocol import covers
from gateway.stores.runtime import Runtime

COMMANDS = ("subscribe", "unsubscribe", "subscriptions")
LISTED = 20  # subscriptions named in a /subscriptions answer

NOT_LINKED = ("This chat is not linked to an account yet. Ask your account for a link code "
              "(POST /v1/auth/link-code) and send /link <code> here; then /subscribe <topic>.")
USAGE = "Send /subscribe <topic>, /unsubscribe <topic> or /subscriptions."
_NAMED = re.compile(r"(?<![\w/])/(link|subscribe|unsubscribe|subscriptions)\b")
_BARE = re.compile(r"\s*(subscribe|unsubscribe)\s+(\S+)\s*|\s*(subscriptions)\s*",
                   re.IGNORECASE)


def bare_command(text: str) -> str:
    """Mattermost's forms without the slash (``subscribe <topic>``, ``subscriptions``, and
    ``link <code>``) as the commands; any other text as it is."""
    match = _BARE.fullmatch(text)
    if match is None:
        return bare_link(text)
    if match.group(3):
        return "/subscriptions"
    return f"/{match.group(1).lower()} {match.group(2)}"


def for_platform(platform: str, text: str) -> str:
    """``text`` with the commands it names written as ``platform`` takes them."""
    if platform == "slack":
        return _NAMED.sub(r"/gw \1", text)
    if platform == "mattermost":
        return _NAMED.sub(r"\1", text)
    return text


def _destination(incoming: Incoming) -> dict[str, str]:
    return {"type": incoming.platform, CHAT_FIELDS[incoming.platform]: incoming.chat}


async def answer(conn: asyncpg.Connection, runtime: Runtime, incoming: Incoming) -> str:
    """The reply to one of the commands. Runs on the connection the message holds."""
    command = command_of(incoming.text)
    words = incoming.text.split()[1:]
    linked = await conn.fetch("SELECT sub, topics FROM chat_links WHERE platform = $1"
                              " AND chat_key = $2 ORDER BY id", incoming.platform,
                              chat_key(incoming))
    if not linked:
        return for_platform(incoming.platform, NOT_LINKED)
    destination = _destination(incoming)
    if command == "subscriptions":
        return await _listing(conn, destination)
    if len(words) != 1:
        return for_platform(incoming.platform, USAGE)
    try:
        topic = check_pattern(words[0])
    except Invalid as exc:
        return f"{exc}."
    if command == "unsubscribe":
        gone = await conn.fetch("DELETE FROM subscriptions WHERE destination = $1"
                                " AND topic = $2 RETURNING id", destination, topic)
        if not gone:
            return f"This chat is not subscribed to {topic}."
        await store.changed(runtime.cache)
        return f"Unsubscribed from {topic}."
    return await _subscribe(conn, runtime, destination, topic,
                            [(r["sub"], r["topics"]) for r in linked])


async def _subscribe(conn: asyncpg.Connection, runtime: Runtime, destination: dict[str, str],
                     topic: str, linked: list[tuple[str, Sequence[str]]]) -> str:
    account = next((sub for sub, topics in linked if any(covers(p, topic) for p in topics)),
                   None)
    if account is None:
        return f"The account linked to this chat may not read {topic}."
    if await conn.fetchval("SELECT EXISTS (SELECT 1 FROM subscriptions WHERE destination = $1"
                           " AND topic = $2)", destination, topic):
        return f"This chat is subscribed to {topic} already."
    limit = NotificationSettings.from_settings(runtime.settings).max_subscriptions_per_credential
    try:
        await store.create_on(conn, keys.owner_namespace(account),
                              Request(topic, None, destination, None, None, None), limit)
    except store.TooMany as exc:
        return f"No more subscriptions: {exc}."
    await store.changed(runtime.cache)
    return f"Subscribed to {topic}: its new events will show here."


async def _listing(conn: asyncpg.Connection, destination: dict[str, str]) -> str:
    rows = await conn.fetch("SELECT topic, state FROM subscriptions WHERE destination = $1"
                            " ORDER BY created_at, id LIMIT $2", destination, LISTED + 1)
    if not rows:
        return "This chat has no subscriptions."
    lines = [f"- {r['topic']}" + (" (paused)" if r["state"] != "active" else "")
             for r in rows[:LISTED]]
    more = "\n…" if len(rows) > LISTED else ""
    return "This chat's subscriptions:\n" + "\n".join(lines) + more
