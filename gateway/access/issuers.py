"""What an issuer (a credential with ``tokens:issue``) may mint, and ending what it minted.

An issuer mints only for the accounts it may (``Principal.may_mint_for``: the admin for
anyone, an API key for its ``subs`` patterns, an access token for its own account), never
wider than its own scopes and topics. What it mints names it (``Principal.minted_from``), in
the access token's ``by`` claim and on the refresh family (``refresh_tokens.issued_by``), so
revoking the issuer ends both: its access tokens through the ``bl:`` marks the credential
check reads, its families here.

Logins and refreshes hold a shared transaction-scoped advisory lock on each name their family
derives from; ending an issuer's families takes that lock exclusively, so a login or refresh
under way commits first (its rows are then found) or runs wholly after (and finds its family
revoked). A login also reads the issuer's marks again under that lock (``still_valid``), so
an issuer revoked a moment before cannot start a family the revocation's query missed."""

from __future__ import annotations

from collections.abc import Iterable

import asyncpg

from gateway.access.principal import MAX_ISSUERS, Principal, covers

_ISSUER_LOCK = 1717920201  # the advisory-lock space of "the families one credential minted"


async def lock_issuers(conn: asyncpg.Connection, names: Iterable[str]) -> None:
    """Shared locks on every name (sorted: every transaction takes them in one order)."""
    for name in sorted(set(names)):
        await conn.execute("SELECT pg_advisory_xact_lock_shared($1, hashtext($2))",
                           _ISSUER_LOCK, name)


async def end_families(conn: asyncpg.Connection, name: str) -> None:
    """Revoke every refresh family minted through ``name`` (``key:<id>``, ``sub:<sub>``,
    ``jti:<jti>``), once the logins and refreshes under way through it have committed."""
    await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _ISSUER_LOCK, name)
    await conn.execute("UPDATE refresh_tokens SET revoked_at = now()"
                       " WHERE $1 = ANY(issued_by) AND revoked_at IS NULL", name)


async def end_families_of(pool: asyncpg.Pool, name: str) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await end_families(conn, name)


def refusal(issuer: Principal, sub: str, scopes: frozenset[str],
            topics: tuple[str, ...]) -> str | None:
    """Why ``issuer`` may not mint this grant, or None when it may."""
    if not issuer.may_mint_for(sub):
        return f"this credential may not mint tokens for the sub {sub[:100]!r}"
    if len(issuer.minted_from()) > MAX_ISSUERS:
        return f"a token may derive from at most {MAX_ISSUERS} credentials"
    extra = sorted(scope for scope in scopes if not issuer.allows(scope))
    if extra:
        return f"wider than the issuing credential: scope(s) {', '.join(extra)}"
    if issuer.is_admin:
        return None
    wider = [t for t in topics if not any(covers(p, t) for p in issuer.topics)]
    return f"wider than the issuing credential: topic(s) {', '.join(wider)}" if wider else None
