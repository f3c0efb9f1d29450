"""Refresh tokens ``grt_<random>`` in PostgreSQL (SHA-256 only), one family per login.

A refresh spends its token and issues the next pair in one transaction that row-locks the
token, so two concurrent refreshes take turns: the first rotates, the second finds the token
spent and, within ``GRACE_SECONDS``, gets the same new pair from ``grace:<hash>`` (two tabs
refreshing at once both succeed). Later, a spent token presented again is taken for theft and
revokes its whole family, the families minted through its tokens, and (``Refused.stolen``:
the route writes ``bl:fam:``) the access tokens it issued.

A family keeps what minted it (``issued_by``) and hands it on to each access token, with its
own name ``fam:<family>``; ``gateway.access.issuers`` ends an issuer's families.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from gateway import keys
from gateway.access.issuers import end_families, lock_issuers
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
    issued_by: tuple[str, ...] = ()  # the issuer's names (``gateway.access.issuers``)
    link_topics: tuple[str, ...] | None = None  # where the account's chat links grant


class Refused(Exception):
    """Why a refresh token is refused (a 401; the token is never in the message).
    ``stolen``: the family a reused token revoked (its access tokens are to end too)."""

    def __init__(self, reason: str, stolen: str | None = None) -> None:
        super().__init__(reason)
        self.stolen = stolen


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

    def _pair(self, grant: Grant, family: str, refresh_token: str) -> dict[str, Any]:
        ttl = min(grant.access_ttl, self.max_ttl or grant.access_ttl)
        access = mint(self.secret, grant.sub, grant.scopes, grant.topics, ttl,
                      issuer=self.issuer, audience=self.audience,
                      issued_by=(*grant.issued_by, f"fam:{family}"),
                      link_topics=grant.link_topics)
        return {"access_token": access, "token_type": "Bearer",
                "expires_in": ttl, "refresh_token": refresh_token}

    async def _store(self, conn: asyncpg.Connection, grant: Grant, family: str) -> str:
        token = PREFIX + secrets.token_urlsafe(32)
        await conn.execute(
            "INSERT INTO refresh_tokens (token_hash, family, sub, scopes, topics, access_ttl,"
            " issued_by, link_topics, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8,"
            f" now() + interval '{REFRESH_DAYS} days')",
            token_hash(token), family, grant.sub, sorted(grant.scopes), list(grant.topics),
            grant.access_ttl, list(grant.issued_by),
            None if grant.link_topics is None else list(grant.link_topics))
        return token

    async def login(self, grant: Grant,
                    still_valid: Callable[[], Awaitable[bool]]) -> dict[str, Any]:
        """A new family: an access token and its first refresh token. ``still_valid``
        reads the issuer's revocation marks afresh, under the issuer locks."""
        async with self.pool.acquire() as conn, conn.transaction():
            await _lock_account(conn, grant.sub)
            await lock_issuers(conn, grant.issued_by)
            if not await still_valid():
                raise Refused("the issuing credential was revoked")
            family = uuid.uuid4().hex
            refresh_token = await self._store(conn, grant, family)
            return self._pair(grant, family, refresh_token)  # minted before the lock is let go

    async def refresh(self, presented: str) -> dict[str, Any]:
        digest = token_hash(presented)
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                pair, family = await self._rotate(conn, digest)
            if pair is None:  # refused only now: the family's revocation is committed
                raise Refused("refresh token reused after rotation: its family is revoked",
                              stolen=family)
        return pair

    async def _rotate(self, conn: asyncpg.Connection,
                      digest: bytes) -> tuple[dict[str, Any] | None, str]:
        """The next pair and its family; no pair when the token was spent before the grace
        (the family is revoked in this transaction)."""
        found = await conn.fetchrow("SELECT sub, issued_by FROM refresh_tokens"
                                    " WHERE token_hash = $1", digest)
        if found is None:
            raise Refused("unknown, expired or revoked refresh token")
        await _lock_account(conn, found["sub"])  # before the row lock, as revoke_sub does
        await lock_issuers(conn, found["issued_by"])
        row = await conn.fetchrow(
            "SELECT family, sub, scopes, topics, access_ttl, issued_by, link_topics, used_at,"
            " revoked_at, expires_at < now() AS expired FROM refresh_tokens"
            " WHERE token_hash = $1 FOR UPDATE", digest)
        if row is None or row["revoked_at"] is not None or row["expired"]:
            raise Refused("unknown, expired or revoked refresh token")
        if row["used_at"] is not None:
            spent = await self.durable.get(keys.refresh_grace(digest.hex()))
            if spent is not None:
                pair: dict[str, Any] = json.loads(spent)
                return pair, row["family"]  # a concurrent refresh of the same token
            await conn.execute("UPDATE refresh_tokens SET revoked_at = now()"
                               " WHERE family = $1 AND revoked_at IS NULL", row["family"])
            await end_families(conn, f"fam:{row['family']}")
            return None, row["family"]
        links = row["link_topics"]
        grant = Grant(row["sub"], frozenset(row["scopes"]), tuple(row["topics"]),
                      row["access_ttl"], tuple(row["issued_by"]),
                      None if links is None else tuple(links))
        await conn.execute("UPDATE refresh_tokens SET used_at = now()"
                           " WHERE token_hash = $1", digest)
        pair = self._pair(grant, row["family"],
                          await self._store(conn, grant, row["family"]))
        # Before the commit: a concurrent refresh waits on the row lock, then reads it.
        await self.durable.set(keys.refresh_grace(digest.hex()), json.dumps(pair),
                               ex=GRACE_SECONDS)
        return pair, row["family"]

    async def revoke_token(self, presented: str) -> bool:
        """The family of a refresh token (its holder logging out)."""
        status = await self.pool.execute(
            "UPDATE refresh_tokens SET revoked_at = now() WHERE revoked_at IS NULL AND family ="
            " (SELECT family FROM refresh_tokens WHERE token_hash = $1)", token_hash(presented))
        return status != "UPDATE 0"

    async def revoke_sub(self, sub: str) -> None:
        """Every family of ``sub`` and every family it minted for others, once the logins
        and refreshes under way have committed (their tokens are then found here); write
        the not-before mark after this returns."""
        async with self.pool.acquire() as conn, conn.transaction():
            await _lock_account(conn, sub)
            await conn.execute("UPDATE refresh_tokens SET revoked_at = now()"
                               " WHERE sub = $1 AND revoked_at IS NULL", sub)
            await end_families(conn, f"sub:{sub}")
