"""A subscription as its delivering process holds it, and the statements that move it.

Every write names the fencing token the subscription was taken with (``fence``) and, for
cursor writes, the ``version`` it was loaded at: a process whose partition lease was taken
over, or whose position a replay changed, writes nothing (the statement answers which
subscriptions it moved, and the others are reloaded or dropped).

Cursor writes take the engine's own pool, whose sessions commit asynchronously
(``synchronous_commit = off``): a cursor write after each delivery is the one write per row,
and waiting for the WAL flush would double a row's cost. A killed gateway process loses
nothing by it (the server has the commit); a crash of PostgreSQL itself can lose the last
fraction of a second of cursor moves, so those rows are delivered again, with the same
``webhook-id`` (a receiver deduplicates on it) and, to chats, behind the sent mark.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from gateway.push.protocol import topic_matches as matches


@dataclass
class Held:
    id: str
    part: int
    topic: str  # a name, or a prefix ending in *
    kinds: frozenset[str] | None
    destination: dict[str, Any]
    secret: str | None
    template: str | None
    state: str
    version: int
    fence: int
    start_after: int
    # topic -> (last offset delivered or skipped, its epoch)
    cursors: dict[str, tuple[int, int]] = field(default_factory=dict)
    head_failures: int = 0
    head_failing_since: float | None = None
    failing_since: float | None = None
    retry_at: float | None = None
    last_error: str | None = None
    # A chat message being posted: {topic, to, epoch, mark, at} (see notifications.chat).
    sending: dict[str, Any] | None = None

    @property
    def type(self) -> str:
        return str(self.destination["type"])

    def follows(self, topic: str) -> bool:
        return matches(self.topic, topic)

    def position(self, topic: str) -> tuple[int, int | None]:
        """(offset, epoch) delivered up to on ``topic``; epoch None: not reached yet."""
        found = self.cursors.get(topic)
        return found if found is not None else (self.start_after, None)

    def wants(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds


def _seconds(value: Any) -> float | None:
    return value.timestamp() if value is not None else None


# Stamp every subscription of the partitions taken with the partition's token (so a holder
# with an older token can no longer write), then read them with their cursors (the SELECT
# sees the rows as before the stamp, which runs whether read or not). A row whose fence is
# above the token was taken by a newer holder: not ours.
_LOAD = """
WITH u AS (SELECT * FROM unnest($1::smallint[], $2::bigint[]) AS u(part, token)),
stamped AS (
    UPDATE subscriptions s SET fence = u.token FROM u
    WHERE s.part = u.part AND s.fence < u.token RETURNING s.id)
SELECT s.id, s.part, s.topic, s.kinds, s.destination, s.secret, s.template, s.state,
       s.version, u.token AS fence, s.start_after, s.head_failures, s.head_failing_since,
       s.failing_since, s.retry_at, s.last_error, s.sending,
       (SELECT coalesce(jsonb_object_agg(c.topic, jsonb_build_array(c."offset", c.epoch)),
                        '{}'::jsonb)
        FROM subscription_cursors c WHERE c.subscription_id = s.id) AS cursors
FROM subscriptions s JOIN u ON s.part = u.part WHERE s.fence <= u.token
"""


async def load(pool: asyncpg.Pool, tokens: dict[int, int]) -> list[Held]:
    """Every subscription of the partitions in ``tokens`` (partition -> lease token)."""
    if not tokens:
        return []
    parts = list(tokens)
    records = await pool.fetch(_LOAD, parts, [tokens[p] for p in parts])
    return [Held(
        r["id"], r["part"], r["topic"], frozenset(r["kinds"]) if r["kinds"] else None,
        r["destination"], r["secret"], r["template"], r["state"], r["version"], r["fence"],
        r["start_after"], {t: (int(v[0]), int(v[1])) for t, v in r["cursors"].items()},
        r["head_failures"], _seconds(r["head_failing_since"]), _seconds(r["failing_since"]),
        _seconds(r["retry_at"]), r["last_error"], r["sending"]) for r in records]


async def fingerprint(pool: asyncpg.Pool, parts: list[int]) -> tuple[int, int]:
    """How many subscriptions these partitions have and a hash of their ids, states and
    versions: the cheap look of a poll (one row), which reloads in full when it moved."""
    record = await pool.fetchrow(
        "SELECT count(*) AS n, coalesce(bit_xor(hashtext(id || ':' || state || ':' ||"
        " version)), 0) AS h FROM subscriptions WHERE part = ANY($1::smallint[])", parts)
    assert record is not None
    return int(record["n"]), int(record["h"])


async def busy_partitions(pool: asyncpg.Pool) -> set[int]:
    """Partitions with an active subscription: the work to share out."""
    return {r["part"] for r in await pool.fetch(
        "SELECT DISTINCT part FROM subscriptions WHERE state = 'active'")}


# Cursor moves of several subscriptions in one statement; a subscription whose fence or
# version moved on is left out (and named by its absence from the answer). A move past a
# failed head also ends the head's failure bookkeeping.
_ADVANCE = """
WITH u AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::int[],
                                $5::bigint[], $6::int[], $7::bool[])
           AS u(id, topic, off, epoch, fence, version, delivered)),
ok AS (
    UPDATE subscriptions s SET
        delivered_at = CASE WHEN u.delivered THEN now() ELSE s.delivered_at END,
        failing_since = CASE WHEN u.delivered THEN NULL ELSE s.failing_since END,
        head_failures = 0, head_failing_since = NULL, retry_at = NULL, sending = NULL
    FROM u WHERE s.id = u.id AND s.fence = u.fence AND s.version = u.version
    RETURNING s.id)
INSERT INTO subscription_cursors (subscription_id, topic, "offset", epoch)
SELECT u.id, u.topic, u.off, u.epoch FROM u JOIN ok ON ok.id = u.id
ON CONFLICT (subscription_id, topic) DO UPDATE
    SET "offset" = EXCLUDED."offset", epoch = EXCLUDED.epoch
RETURNING subscription_id
"""

# The same for one move, with plain parameters: the common statement of a subscription
# delivering a backlog alone, cheaper to encode than seven one-element arrays.
_ADVANCE_ONE = """
WITH ok AS (
    UPDATE subscriptions s SET
        delivered_at = CASE WHEN $7 THEN now() ELSE s.delivered_at END,
        failing_since = CASE WHEN $7 THEN NULL ELSE s.failing_since END,
        head_failures = 0, head_failing_since = NULL, retry_at = NULL, sending = NULL
    WHERE s.id = $1 AND s.fence = $5 AND s.version = $6
    RETURNING s.id)
INSERT INTO subscription_cursors (subscription_id, topic, "offset", epoch)
SELECT ok.id, $2, $3, $4 FROM ok
ON CONFLICT (subscription_id, topic) DO UPDATE
    SET "offset" = EXCLUDED."offset", epoch = EXCLUDED.epoch
RETURNING subscription_id
"""

# (held, topic, offset, epoch, delivered)
Move = tuple[Held, str, int, int, bool]


async def advance(conn: asyncpg.Connection, moves: list[Move]) -> set[str]:
    """Move each subscription's cursor; returns the ids moved (the others lost their fence
    or were replayed meanwhile). One subscription at most once per call."""
    if len(moves) == 1:
        held, topic, offset, epoch, delivered = moves[0]
        moved = await conn.fetchval(_ADVANCE_ONE, held.id, topic, offset, epoch, held.fence,
                                    held.version, delivered)
        return set() if moved is None else {held.id}
    records = await conn.fetch(
        _ADVANCE, [h.id for h, *_ in moves], [m[1] for m in moves], [m[2] for m in moves],
        [m[3] for m in moves], [h.fence for h, *_ in moves], [h.version for h, *_ in moves],
        [m[4] for m in moves])
    return {r["subscription_id"] for r in records}


_FAILED = """
UPDATE subscriptions SET head_failures = $3, head_failing_since = to_timestamp($4),
    failing_since = to_timestamp($5), retry_at = to_timestamp($6), last_error = $7
WHERE id = $1 AND fence = $2 AND version = $8 RETURNING id
"""


async def failed(pool: asyncpg.Pool, held: Held) -> bool:
    """Record the head's failure (its count, since when, the next attempt, the error)."""
    return await pool.fetchval(
        _FAILED, held.id, held.fence, held.head_failures, held.head_failing_since,
        held.failing_since, held.retry_at, held.last_error, held.version) is not None


_GIVE_UP = """
WITH ok AS (
    UPDATE subscriptions SET head_failures = 0, head_failing_since = NULL, retry_at = NULL,
        failing_since = to_timestamp($9), last_error = $7
    WHERE id = $1 AND fence = $2 AND version = $3 RETURNING id),
failure AS (
    INSERT INTO subscription_failures (subscription_id, topic, "offset", kind, attempts,
                                       error, first_failed_at)
    SELECT ok.id, $4, $5, $10, $8, $7, to_timestamp($11) FROM ok)
INSERT INTO subscription_cursors (subscription_id, topic, "offset", epoch)
SELECT ok.id, $4, $5, $6 FROM ok
ON CONFLICT (subscription_id, topic) DO UPDATE
    SET "offset" = EXCLUDED."offset", epoch = EXCLUDED.epoch
RETURNING subscription_id
"""


async def give_up(pool: asyncpg.Pool, held: Held, topic: str, offset: int, epoch: int,
                  kind: str) -> bool:
    """Record the head row under the subscription's failures and move past it."""
    return await pool.fetchval(
        _GIVE_UP, held.id, held.fence, held.version, topic, offset, epoch,
        held.last_error or "failed", held.head_failures, held.failing_since, kind,
        held.head_failing_since or time.time()) is not None


async def sending(pool: asyncpg.Pool, held: Held, message: dict[str, Any]) -> bool:
    """Record the chat message about to be posted (its mark and the rows it covers)."""
    return await pool.fetchval(
        "UPDATE subscriptions SET sending = $3 WHERE id = $1 AND fence = $2 RETURNING id",
        held.id, held.fence, message) is not None


async def pause(pool: asyncpg.Pool, held: Held, error: str) -> bool:
    """Pause the subscription with ``error`` (its endpoint is gone, or it failed too long)."""
    return await pool.fetchval(
        "UPDATE subscriptions SET state = 'paused', last_error = $3"
        " WHERE id = $1 AND fence = $2 RETURNING id", held.id, held.fence, error) is not None


_HEADS = """
SELECT topic, epoch, last_offset FROM feed_topics
WHERE topic = ANY($1::text[])
   OR EXISTS (SELECT 1 FROM unnest($2::text[]) AS p(prefix) WHERE starts_with(topic, p.prefix))
"""


async def heads(pool: asyncpg.Pool, names: list[str],
                prefixes: list[str]) -> dict[str, tuple[int, int]]:
    """(epoch, last offset) of the named topics and of those the prefixes cover."""
    return {r["topic"]: (r["epoch"], r["last_offset"])
            for r in await pool.fetch(_HEADS, names, prefixes)}
