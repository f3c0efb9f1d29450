"""API keys ``gk_<id>_<secret>`` for servers: PostgreSQL keeps the SHA-256 only, and every
request reads the key's row by primary key, so a revocation is refused on every replica from
the next request (one indexed read; no cache to go stale)."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import re
import secrets
import sys
from typing import Any

import asyncpg

from gateway.access.principal import Principal, parse_scopes, parse_topics
from gateway.config import Settings
from gateway.stores.postgres import create_pool

PREFIX = "gk_"
_KEY = re.compile(r"^gk_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")


def _hash(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def looks_like_key(credential: str) -> bool:
    return credential.startswith(PREFIX)


async def create(db: asyncpg.Pool | asyncpg.Connection, name: str, scopes: frozenset[str],
                 topics: tuple[str, ...]) -> dict[str, Any]:
    key_id = secrets.token_hex(6)
    key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    await db.execute("INSERT INTO api_keys (id, name, key_hash, scopes, topics)"
                     " VALUES ($1, $2, $3, $4, $5)", key_id, name, _hash(key),
                     sorted(scopes), list(topics))
    return {"id": key_id, "key": key, "name": name, "scopes": sorted(scopes),
            "topics": list(topics)}


async def verify(db: asyncpg.Pool, key: str) -> Principal | None:
    """The key's principal, or None (malformed, unknown, wrong secret or revoked)."""
    match = _KEY.match(key)
    if not match:
        return None
    row = await db.fetchrow("SELECT key_hash, scopes, topics, revoked_at FROM api_keys"
                            " WHERE id = $1", match.group(1))
    if row is None or not hmac.compare_digest(bytes(row["key_hash"]), _hash(key)):
        return None
    if row["revoked_at"] is not None:
        return None
    return Principal("apikey", match.group(1), frozenset(row["scopes"]), tuple(row["topics"]))


async def listing(db: asyncpg.Pool) -> list[dict[str, Any]]:
    rows = await db.fetch("SELECT id, name, scopes, topics, created_at, revoked_at"
                          " FROM api_keys ORDER BY created_at, id")
    return [{"id": r["id"], "name": r["name"], "scopes": list(r["scopes"]),
             "topics": list(r["topics"]), "created_at": r["created_at"].isoformat(),
             "revoked_at": r["revoked_at"].isoformat() if r["revoked_at"] else None}
            for r in rows]


async def revoke(db: asyncpg.Pool, key_id: str) -> bool:
    status = await db.execute("UPDATE api_keys SET revoked_at = now()"
                              " WHERE id = $1 AND revoked_at IS NULL", key_id)
    return status == "UPDATE 1"


# --- CLI: gateway apikey create|list|revoke ----------------------------------------------

async def _run(args: argparse.Namespace, settings: Settings) -> int:
    assert settings.database_url
    pool = await create_pool(settings.database_url, max_size=2)
    try:
        if args.apikey_action == "create":
            try:
                scopes = parse_scopes(args.scopes)
            except ValueError as exc:
                print(f"gateway apikey create: {exc}", file=sys.stderr)
                return 2
            print(json.dumps(await create(pool, args.name, scopes, parse_topics(args.topics))))
        elif args.apikey_action == "list":
            for entry in await listing(pool):
                print(json.dumps(entry))
        elif not await revoke(pool, args.id):
            print(f"gateway apikey revoke: no active key {args.id!r}", file=sys.stderr)
            return 1
        else:
            print(json.dumps({"id": args.id, "revoked": True}))
    finally:
        await pool.close()
    return 0


def main(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.database_url:
        print("gateway apikey: GATEWAY_DATABASE_URL is required", file=sys.stderr)
        return 2
    return asyncio.run(_run(args, settings))
