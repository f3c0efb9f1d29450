"""Subscriptions in PostgreSQL: create, read, change and list them (``0014_subscriptions.sql``).

Every change a delivering process must see (pause, resume, replay, delete) is signalled on
``push:gateway.subscriptions`` after its commit, so the holder reloads the subscription at
once; the holders' poll finds it too when the signal is lost. A replay raises ``version``,
which refuses a holder's cursor write made for the position before it.
"""

from __future__ import annotations

import secrets
from typing import Any

import asyncpg

from gateway.notifications.subscriptions import Request
from gateway.push.channel import publish_signal
from gateway.stores.redis import AnyRedis

PARTITIONS = 64  # fixed: a subscription's partition never changes, nor may this
CHANGES_TOPIC = "gateway.subscriptions"  # its push: channel wakes the holders
MAX_LIST = 1000
CURSOR_SHOWN = 100  # topics of a subscription's cursor in an answer (a prefix may reach many)

_COLUMNS = """s.id, s.owner, s.topic, s.kinds, s.destination, s.template, s.state,
    s.last_error, s.failing_since, s.created_at, s.delivered_at, s.start_after,
    (SELECT jsonb_object_agg(c.topic, c."offset") FROM (
        SELECT topic, "offset" FROM subscription_cursors WHERE subscription_id = s.id
        ORDER BY topic LIMIT $CURSOR) c) AS cursor""".replace("$CURSOR", str(CURSOR_SHOWN))

# Rows behind, over the topics the subscription follows (every kind counted).
_LAG = """(SELECT coalesce(sum(greatest(t.last_offset - CASE WHEN c.epoch = t.epoch
        THEN c."offset" WHEN c.epoch IS NULL THEN s.start_after ELSE 0 END, 0)), 0)
    FROM feed_topics t LEFT JOIN subscription_cursors c
        ON c.subscription_id = s.id AND c.topic = t.topic
    WHERE CASE WHEN right(s.topic, 1) = '*' THEN starts_with(t.topic, left(s.topic, -1))
               ELSE t.topic = s.topic END)::bigint AS lag"""


class NotFound(LookupError):
    pass


def to_json(record: asyncpg.Record, *, lag: bool = False) -> dict[str, Any]:
    """A subscription as the API shows it (never its secret)."""
    answer: dict[str, Any] = {
        "id": record["id"], "topic": record["topic"],
        "kinds": list(record["kinds"]) if record["kinds"] is not None else None,
        "destination": record["destination"],
        "template": record["template"], "state": record["state"],
        "cursor": record["cursor"] or {}, "last_error": record["last_error"],
        "failing_since": _time(record["failing_since"]),
        "delivered_at": _time(record["delivered_at"]),
        "created_at": _time(record["created_at"]), "owner": record["owner"],
    }
    if lag:
        answer["lag"] = int(record["lag"])
    return answer


def _time(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


_INSERT = """
INSERT INTO subscriptions (id, owner, part, topic, kinds, destination, secret, template,
                           start_after)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9)
"""
# Where the subscription starts on every topic it follows that exists now: at its end, or
# after "after". Topics that appear later start after start_after.
_START = """
INSERT INTO subscription_cursors (subscription_id, topic, "offset", epoch)
SELECT $1, t.topic, coalesce($3, t.last_offset), t.epoch FROM feed_topics t
WHERE CASE WHEN right($2, 1) = '*' THEN starts_with(t.topic, left($2, -1))
           ELSE t.topic = $2 END
"""


async def create(pool: asyncpg.Pool, cache: AnyRedis, owner: str, request: Request,
                 limit: int | None) -> tuple[dict[str, Any], str | None]:
    """A new subscription owned by ``owner`` (at most ``limit`` per owner; None: no limit);
    answers it and its secret, which is never shown again."""
    async with pool.acquire() as conn:
        created = await create_on(conn, owner, request, limit)
    await changed(cache)
    return created, request.secret


async def create_on(conn: asyncpg.Connection, owner: str, request: Request,
                    limit: int | None) -> dict[str, Any]:
    """``create`` on a connection the caller holds (a chat's command), in a transaction of
    its own; the caller signals ``changed`` after it."""
    sub_id = "sub_" + secrets.token_hex(8)
    async with conn.transaction():
        if limit is not None:
            # One creator at a time per owner, so the count holds under concurrency.
            await conn.execute("SELECT pg_advisory_xact_lock(1717920200, hashtext($1))", owner)
            count = await conn.fetchval("SELECT count(*) FROM subscriptions WHERE owner = $1",
                                        owner)
            if count >= limit:
                raise TooMany(limit)
        await conn.execute(_INSERT, sub_id, owner, secrets.randbelow(PARTITIONS),
                           request.topic, list(request.kinds) if request.kinds else None,
                           request.destination, request.secret, request.template,
                           request.after or 0)
        await conn.execute(_START, sub_id, request.topic, request.after)
        return to_json(await _get(conn, sub_id, None))


class TooMany(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"at most {limit} subscriptions per credential")
        self.limit = limit


async def _get(conn: asyncpg.Pool | asyncpg.Connection, sub_id: str,
               owner: str | None) -> asyncpg.Record:
    record = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM subscriptions s WHERE s.id = $1"
        " AND ($2::text IS NULL OR s.owner = $2)", sub_id, owner)
    if record is None:
        raise NotFound(sub_id)
    return record


async def get(pool: asyncpg.Pool, sub_id: str, owner: str | None) -> dict[str, Any]:
    """One subscription of ``owner`` (None: anyone's, for the admin)."""
    return to_json(await _get(pool, sub_id, owner))


async def listing(pool: asyncpg.Pool, owner: str | None, limit: int, after: str | None,
                  *, lag: bool = False) -> list[dict[str, Any]]:
    """``owner``'s subscriptions (None: all), oldest first, after the id ``after``."""
    records = await pool.fetch(
        f"SELECT {_COLUMNS}{', ' + _LAG if lag else ''} FROM subscriptions s"
        " WHERE ($1::text IS NULL OR s.owner = $1)"
        " AND ($2::text IS NULL OR (s.created_at, s.id) > (SELECT created_at, id"
        "      FROM subscriptions WHERE id = $2))"
        " ORDER BY s.created_at, s.id LIMIT $3", owner, after, limit)
    return [to_json(r, lag=lag) for r in records]


async def delete(pool: asyncpg.Pool, cache: AnyRedis, sub_id: str, owner: str | None) -> None:
    found = await pool.fetchval("DELETE FROM subscriptions WHERE id = $1"
                                " AND ($2::text IS NULL OR owner = $2) RETURNING id",
                                sub_id, owner)
    if found is None:
        raise NotFound(sub_id)
    await changed(cache)


async def set_state(pool: asyncpg.Pool, cache: AnyRedis, sub_id: str, owner: str | None,
                    state: str) -> dict[str, Any]:
    """Pause, or resume (which forgets the last error: the head is tried again at once)."""
    resumed = state == "active"
    found = await pool.fetchval(
        "UPDATE subscriptions SET state = $3,"
        " last_error = CASE WHEN $4 THEN NULL ELSE last_error END,"
        " failing_since = CASE WHEN $4 THEN NULL ELSE failing_since END,"
        " retry_at = CASE WHEN $4 THEN NULL ELSE retry_at END"
        " WHERE id = $1 AND ($2::text IS NULL OR owner = $2) RETURNING id",
        sub_id, owner, state, resumed)
    if found is None:
        raise NotFound(sub_id)
    await changed(cache)
    return await get(pool, sub_id, owner)


async def replay(pool: asyncpg.Pool, cache: AnyRedis, sub_id: str, owner: str | None,
                 after: int) -> dict[str, Any]:
    """Deliver again from offset ``after`` + 1 on every topic the subscription has reached
    beyond it (and on topics it reaches later)."""
    async with pool.acquire() as conn, conn.transaction():
        found = await conn.fetchval(
            "UPDATE subscriptions SET version = version + 1, head_failures = 0,"
            " head_failing_since = NULL, retry_at = NULL, start_after = least(start_after, $3)"
            " WHERE id = $1 AND ($2::text IS NULL OR owner = $2) RETURNING id",
            sub_id, owner, after)
        if found is None:
            raise NotFound(sub_id)
        await conn.execute('UPDATE subscription_cursors SET "offset" = $2'
                           ' WHERE subscription_id = $1 AND "offset" > $2', sub_id, after)
    await changed(cache)
    return await get(pool, sub_id, owner)


async def failures(pool: asyncpg.Pool, sub_id: str, owner: str | None, limit: int,
                   after: int) -> list[dict[str, Any]]:
    """The rows given up on, oldest first, after the failure id ``after``."""
    await _get(pool, sub_id, owner)
    records = await pool.fetch(
        'SELECT id, topic, "offset", kind, attempts, error, first_failed_at, failed_at'
        " FROM subscription_failures WHERE subscription_id = $1 AND id > $2"
        " ORDER BY id LIMIT $3", sub_id, after, limit)
    return [{"id": r["id"], "topic": r["topic"], "offset": r["offset"], "kind": r["kind"],
             "attempts": r["attempts"], "error": r["error"],
             "first_failed_at": _time(r["first_failed_at"]),
             "failed_at": _time(r["failed_at"])} for r in records]


async def changed(cache: AnyRedis) -> None:
    """Wake the delivering processes: a subscription was made, changed or removed."""
    await publish_signal(cache, CHANGES_TOPIC, 0, "changed", 0)


_SUMMARY = f"""
SELECT s.id, s.topic, s.destination->>'type' AS type, s.state, s.last_error, {_LAG}
FROM subscriptions s ORDER BY lag DESC, s.created_at LIMIT $1
"""


async def summary(pool: asyncpg.Pool, shown: int = 10) -> dict[str, Any]:
    """For the dashboard: how many subscriptions by state, the rows they are behind in all,
    and the ``shown`` furthest behind."""
    counts = await pool.fetchrow(
        "SELECT count(*) AS total, count(*) FILTER (WHERE state = 'active') AS active"
        " FROM subscriptions")
    assert counts is not None
    behind = await pool.fetch(_SUMMARY, shown)
    total_lag = await pool.fetchval(f"SELECT coalesce(sum(lag), 0) FROM (SELECT {_LAG}"
                                    " FROM subscriptions s) l")
    return {"total": counts["total"], "active": counts["active"],
            "paused": counts["total"] - counts["active"], "lag": int(total_lag),
            "behind": [{"id": r["id"], "topic": r["topic"], "type": r["type"],
                        "state": r["state"], "lag": int(r["lag"]),
                        "last_error": r["last_error"]} for r in behind]}
