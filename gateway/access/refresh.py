"""Refresh tokens ``grt_<random>`` in PostgreSQL (SHA-256 only), one family per login.

A refresh spends its token and issues the next pair in one transaction that row-locks the
token, so two concurrent refreshes take turns: the first rotates, the second finds the token
spent and, within ``GRACE_SECONDS``, gets the same new pair from ``grace:<hash>`` (two tabs
refreshing at once both succeed). Later, a spent token presented again is taken for theft and
revokes its whole family.

Logins, refreshes and an account's revocation take turns on one transaction-scoped advisory
lock per ``sub``: a "log out everywhere" ends every family committed before it, and a refresh
or login waiting on it finds its token revoked or runs wholly after (its new tokens then
stand, as they should). The not-before mark is written after that, so every access token
minted before the families ended is older than the mark.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from gateway import keys
from gateway.access.principal import Principal
from gateway.access.tokens import mint
from gateway.stores.redis import AnyRedis

PREFIX = "grt_"
GRACE_SECONDS = 10
REFRESH_DAYS = 30
_ACCOUNT_LOCK = 1717920200  # the advisory-lock space of "one account's refresh families"


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True)
class Grant:
    sub: str
    scopes: frozenset[str]
    topics: tuple[str, ...]
    access_ttl: int


class Refused(Exception):
    """Why a refresh token is refused (a 401; the token is never in the message)."""


async def _lock_account(conn: asyncpg.Connection, sub: str) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _ACCOUNT_LOCK, sub)


class Issuer:
    def __init__(self, pool: asyncpg.Pool, durable: AnyRedis, secret: str, *,
                 issuer: str | None = None, audience: str | None = None,
                 max_ttl: int | None = None) -> None:
        self.pool = pool
        self.durable = durable
        self.secret = secret
        self.issuer = issuer
        self.audience = audience
        self.max_ttl = max_ttl  # a family's lifetime beyond what is accepted now: cut to it

    def _pair(self, grant: Grant, refresh_token: str) -> dict[str, Any]:
        ttl = min(grant.access_ttl, self.max_ttl or grant.access_ttl)
        access = mint(self.secret, grant.sub, grant.scopes, grant.topics, ttl,
                      issuer=self.issuer, audience=self.audience)
        return {"access_token": access, "token_type": "Bearer",
                "expires_in": ttl, "refresh_token": refresh_token}

    async def _store(self, conn: asyncpg.Connection, grant: Grant, family: str) -> str:
        token = PREFIX + secrets.token_urlsafe(32)
        await conn.execute(
            "INSERT INTO refresh_tokens (token_hash, family, sub, scopes, topics, access_ttl,"
            " expires_at) VALUES ($1, $2, $3, $4, $5, $6,"
            f" now() + interval '{REFRESH_DAYS} days')",
            token_hash(token), family, grant.sub, sorted(grant.scopes), list(grant.topics),
            grant.access_ttl)
        return token

    async def login(self, grant: Grant) -> dict[str, Any]:
        """A new family: an access token and its first refresh token."""
        async with self.pool.acquire() as conn, conn.transaction():
            await _lock_account(conn, grant.sub)
            refresh_token = await self._store(conn, grant, uuid.uuid4().hex)
            return self._pair(grant, refresh_token)  # minted before the lock is let go

    async def refresh(self, presented: str) -> dict[str, Any]:
        digest = token_hash(presented)
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                pair = await self._rotate(conn, digest)
            if pair is None:  # refused only now: the family's revocation is committed
                raise Refused("refresh token reused after rotation: its family is revoked")
        return pair

    async def _rotate(self, conn: asyncpg.Connection, digest: bytes) -> dict[str, Any] | None:
        """The next pair; None when the token was spent before the grace (the family is
        revoked in this transaction)."""
        sub = await conn.fetchval("SELECT sub FROM refresh_tokens WHERE token_hash = $1", digest)
        if sub is None:
            raise Refused("unknown, expired or revoked refresh token")
        await _lock_account(conn, sub)  # before the row lock, as revoke_sub takes them
        row = await conn.fetchrow(
            "SELECT family, sub, scopes, topics, access_ttl, used_at, revoked_at,"
            " expires_at < now() AS expired FROM refresh_tokens WHERE token_hash = $1"
            " FOR UPDATE", digest)
        if row is None or row["revoked_at"] is not None or row["expired"]:
            raise Refused("unknown, expired or revoked refresh token")
        if row["used_at"] is not None:
            spent = await self.durable.get(keys.refresh_grace(digest.hex()))
            if spent is not None:
                pair: dict[str, Any] = json.loads(spent)
                return pair  # a concurrent refresh of the same token: the same pair
            await conn.execute("UPDATE refresh_tokens SET revoked_at = now()"
                               " WHERE family = $1 AND revoked_at IS NULL", row["family"])
            return None
        grant = Grant(row["sub"], frozenset(row["scopes"]), tuple(row["topics"]),
                      row["access_ttl"])
        await conn.execute("UPDATE refresh_tokens SET used_at = now()"
                           " WHERE token_hash = $1", digest)
        pair = self._pair(grant, await self._store(conn, grant, row["family"]))
        # Before the commit: a concurrent refresh waits on the row lock, then reads it.
        await self.durable.set(keys.refresh_grace(digest.hex()), json.dumps(pair),
                               ex=GRACE_SECONDS)
        return pair

    async def revoke_token(self, presented: str) -> bool:
        """The family of a refresh token (its holder logging out)."""
        status = await self.pool.execute(
            "UPDATE refresh_tokens SET revoked_at = now() WHERE revoked_at IS NULL AND family ="
            " (SELECT family FROM refresh_tokens WHERE token_hash = $1)", token_hash(presented))
        return status != "UPDATE 0"

    async def revoke_sub(self, sub: str) -> None:
        """Every family of ``sub``, once its logins and refreshes under way have committed
        (their tokens are then found here); write the not-before mark after this returns."""
        async with self.pool.acquire() as conn, conn.transaction():
            await _lock_account(conn, sub)
            await conn.execute("UPDATE refresh_tokens SET revoked_at = now()"
                               " WHERE sub = $1 AND revoked_at IS NULL", sub)


def narrower(issuer: Principal, scopes: frozenset[str], topics: tuple[str, ...]) -> str | None:
    """What the requested grant has beyond the issuer's own, or None when it has nothing."""
    extra = sorted(scope for scope in scopes if not issuer.allows(scope))
    if extra:
        return f"scope(s) {', '.join(extra)}"
    if issuer.is_admin:
        return None
    wider = [t for t in topics if not any(_covers(p, t) for p in issuer.topics)]
    return f"topic(s) {', '.join(wider)}" if wider else None


def _covers(pattern: str, requested: str) -> bool:
    """Does ``pattern`` allow every topic ``requested`` (itself maybe a pattern) names?"""
    if pattern.endswith("*"):
        return requested.removesuffix("*").startswith(pattern[:-1])
    return pattern == requested
