"""API keys ``gk_<id>_<secret>`` for servers: PostgreSQL keeps the SHA-256 only.

A process keeps a key's row for ``ROW_SECONDS`` (reading PostgreSQL on every request cost
~300 µs of CPU); what makes a revocation hold on every replica from the next request is the
``bl:key:<id>`` mark the revocation writes to redis-durable before it returns, which every
request checks: one command, coalesced with the others, or, on a route that writes with a
script (``POST /v1/jobs``), inside that script (``check_mark=False``)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import hmac
import json
import re
import secrets
import sys
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from gateway import keys
from gateway.access import issuers
from gateway.access.bounded import Bounded, Fresh
from gateway.access.principal import Principal, parse_scopes, parse_topics
from gateway.access.tokens import longest_life
from gateway.config import Settings
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.postgres import create_pool
from gateway.stores.redis import AnyRedis
from gateway.stores.runtime import connect_redis

PREFIX = "gk_"
_KEY = re.compile(r"^gk_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")


def _hash(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def looks_like_key(credential: str) -> bool:
    return credential.startswith(PREFIX)


async def create(db: asyncpg.Pool | asyncpg.Connection, name: str, scopes: frozenset[str],
                 topics: tuple[str, ...], subs: tuple[str, ...] = ()) -> dict[str, Any]:
    """``subs``: patterns (a name, or a prefix ending in ``*``) of the accounts the key may
    mint tokens for, with ``tokens:issue``; none by default."""
    key_id = secrets.token_hex(6)
    key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    await db.execute("INSERT INTO api_keys (id, name, key_hash, scopes, topics, subs)"
                     " VALUES ($1, $2, $3, $4, $5, $6)", key_id, name, _hash(key),
                     sorted(scopes), list(topics), list(subs))
    return {"id": key_id, "key": key, "name": name, "scopes": sorted(scopes),
            "topics": list(topics), "subs": list(subs)}


ROW_SECONDS = 60.0
ROWS = 10_000
MARK_SECONDS = 1.0  # an open stream learns of its key's revocation this late at most
REVOKED_MARK_SECONDS = 86400  # far longer than a row is kept: then PostgreSQL says so too


@dataclass(frozen=True)
class _Row:
    key_hash: bytes
    principal: Principal
    revoked: bool
    read_at: float
    deferred: Principal  # the principal with its revocation mark left for the route to check


class ApiKeys:
    """Verifies keys for one process: rows cached briefly, revocation marks checked always.

    ``pool`` is the pool of client reads (``Runtime.pg_reads``): a key id not in the cache
    costs a PostgreSQL read, and an unknown id is never kept, so a flood of made-up keys
    (from many addresses: the brute-force barrier lets one address make only
    ``brute_max_failures`` guesses, then blocks it before its key is looked at) queues on
    that pool's few connections and is refused with 503 after its bounded wait
    (``READ_WAIT_SECONDS``), never taking a connection the record's writers need."""

    def __init__(self, pool: asyncpg.Pool, auto: AutoPipeline) -> None:
        self.pool = pool
        self.auto = auto
        self._rows: Bounded[str, _Row] = Bounded(ROWS)
        # For open streams only (every request reads the mark itself): a key's many streams
        # cost one read a second.
        self._marks: Fresh[str, bool] = Fresh(MARK_SECONDS, ROWS)

    async def verify(self, key: str, check_mark: bool = True) -> Principal | None:
        """The key's principal, or None (malformed, unknown, wrong secret or revoked).
        ``check_mark=False``: the caller's own write checks the revocation mark (the
        principal carries it as ``revocation_mark``), so it costs no round trip here."""
        match = _KEY.match(key)
        if not match:
            return None
        key_id = match.group(1)
        row = self._rows.get(key_id)
        if row is None or time.monotonic() - row.read_at > ROW_SECONDS:
            row = await self._read(key_id)
            if row is None:
                return None
        if row.revoked or not hmac.compare_digest(row.key_hash, _hash(key)):
            return None
        if not check_mark:
            return row.deferred
        if await self._revoked(key_id):
            return None
        return row.principal

    async def revoked_lately(self, key_id: str) -> bool:
        """Is the key revoked, as read at most ``MARK_SECONDS`` ago (for open streams)?"""
        return await self._marks.get(key_id, lambda: self._revoked(key_id))

    async def _revoked(self, key_id: str) -> bool:
        return bool(int(await self.auto.execute("EXISTS", keys.revoked_key(key_id))))

    async def _read(self, key_id: str) -> _Row | None:
        found = await self.pool.fetchrow("SELECT key_hash, scopes, topics, subs, revoked_at"
                                         " FROM api_keys WHERE id = $1", key_id)
        if found is None:
            return None
        principal = Principal("apikey", key_id, frozenset(found["scopes"]),
                              tuple(found["topics"]), subs=tuple(found["subs"]))
        row = _Row(bytes(found["key_hash"]), principal, found["revoked_at"] is not None,
                   time.monotonic(), dataclasses.replace(
                       principal, revocation_mark=keys.revoked_key(key_id)))
        self._rows.put(key_id, row)
        return row


async def listing(db: asyncpg.Pool) -> list[dict[str, Any]]:
    rows = await db.fetch("SELECT id, name, scopes, topics, subs, created_at, revoked_at"
                          " FROM api_keys ORDER BY created_at, id")
    return [{"id": r["id"], "name": r["name"], "scopes": list(r["scopes"]),
             "topics": list(r["topics"]), "subs": list(r["subs"]),
             "created_at": r["created_at"].isoformat(),
             "revoked_at": r["revoked_at"].isoformat() if r["revoked_at"] else None}
            for r in rows]


async def revoke(db: asyncpg.Pool, durable: AnyRedis, key_id: str,
                 longest: int = REVOKED_MARK_SECONDS) -> bool:
    """Mark the key revoked for every replica at once (for as long as a token it minted
    can live, ``longest``, at least a day), then record it in PostgreSQL and end the refresh
    families it minted."""
    await durable.set(keys.revoked_key(key_id), "1", ex=max(REVOKED_MARK_SECONDS, longest))
    status = await db.execute("UPDATE api_keys SET revoked_at = now()"
                              " WHERE id = $1 AND revoked_at IS NULL", key_id)
    await issuers.end_families_of(db, f"key:{key_id}")
    return status == "UPDATE 1"


# --- CLI: gateway apikey create|list|revoke ----------------------------------------------

async def _run(args: argparse.Namespace, settings: Settings) -> int:
    assert settings.database_url
    pool = await create_pool(settings.database_url, max_size=2)
    durable, cache = connect_redis(settings) if args.apikey_action == "revoke" else (None, None)
    try:
        if args.apikey_action == "create":
            try:
                scopes = parse_scopes(args.scopes)
            except ValueError as exc:
                print(f"gateway apikey create: {exc}", file=sys.stderr)
                return 2
            print(json.dumps(await create(pool, args.name, scopes, parse_topics(args.topics),
                                          parse_topics(args.subs))))
        elif args.apikey_action == "list":
            for entry in await listing(pool):
                print(json.dumps(entry))
        elif durable is None or not await revoke(pool, durable, args.id,
                                                 longest_life(settings) + 1):
            print(f"gateway apikey revoke: no active key {args.id!r}", file=sys.stderr)
            return 1
        else:
            print(json.dumps({"id": args.id, "revoked": True}))
    finally:
        await pool.close()
        for client in (durable, cache):
            if client is not None:
                await client.aclose()
    return 0


def main(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.database_url or (args.apikey_action == "revoke"
                                     and not settings.durable_url):
        print("gateway apikey: GATEWAY_DATABASE_URL (and for revoke GATEWAY_DURABLE_URL) "
              "is required", file=sys.stderr)
        return 2
    return asyncio.run(_run(args, settings))
