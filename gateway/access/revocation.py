"""Early revocation of stateless access tokens. A token is refused when any credential it
names is revoked: its own ``jti`` (``bl:jti:<jti>``), its account (``bl:sub:<sub>`` = a
not-before time: tokens of that account issued earlier are refused), or anything it was
minted through (its ``by`` claim, ``gateway.access.principal``): an API key
(``bl:key:<id>``), an issuing token's ``jti`` or account, a refresh family revoked for theft
(``bl:fam:<family>``). Every not-before mark among them is compared with the token's own
``iat`` (an issuer's tokens minted before its account's revocation are older than the mark).

Checking costs no round trip per request: each process remembers what it read for
``CACHE_SECONDS``, so a revocation holds on every other process within that bound (1 s), and
reads for concurrent requests share one round trip through the coalescer. The process that
takes a revocation also keeps what it wrote (``_wrote``, bounded, consulted on every check),
so there it holds from the next request.

The not-before mark is the revocation's ``time.time()`` and a token's ``iat`` is compared with
it exactly: the gateway mints ``iat`` with sub-second precision, so its tokens issued after the
revocation pass, even within the same second. A whole-second ``iat`` (an identity provider's)
counts as the start of its second: such a token issued in the second of the revocation is
refused with the older ones (it cannot be told apart from them); one of the next second
passes. A token without ``iat`` is refused once its account has a mark."""

from __future__ import annotations

import time
from typing import Any

from gateway import keys
from gateway.access.bounded import Bounded, Fresh
from gateway.access.principal import Principal
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.redis import AnyRedis

CACHE_SECONDS = 1.0
CACHE_ENTRIES = 10_000  # bounded however many distinct tokens a client presents
# What this process wrote is kept past any cached read taken before it (CACHE_SECONDS);
# after that the reads say the same.
LOCAL_SECONDS = 2 * CACHE_SECONDS
_MARKS = {"jti": keys.revoked_jti, "key": keys.revoked_key, "fam": keys.revoked_family}
Marks = tuple[bool, float | None]  # (a name revoked, the latest not-before of its accounts)


def names(principal: Principal) -> tuple[str, ...]:
    """Every credential the token stands on: its issuers', then its own jti and account."""
    own = (f"jti:{principal.jti}",) if principal.jti else ()
    return (*principal.issued_by, *own, f"sub:{principal.id}")


def _command(name: str) -> tuple[Any, ...] | None:
    kind, _, value = name.partition(":")
    if kind == "sub":
        return ("GET", keys.revoked_before(value))
    mark = _MARKS.get(kind)
    return ("EXISTS", mark(value)) if mark else None


class Revocations:
    def __init__(self, durable: AnyRedis) -> None:
        self.durable = durable
        self.auto = AutoPipeline(durable)
        # The token's names -> its marks, not a verdict: tokens without a jti share an
        # entry, each judged by its own iat.
        self._seen: Fresh[tuple[str, ...], Marks] = Fresh(CACHE_SECONDS, CACHE_ENTRIES)
        # Written here: name -> (monotonic time written, its not-before mark or 0.0).
        self._wrote: Bounded[str, tuple[float, float]] = Bounded(CACHE_ENTRIES)

    async def revoked(self, principal: Principal, issued_at: float | None) -> bool:
        """Is this token revoked (its jti, its account since after it was issued, or a
        credential it was minted through)?"""
        if principal.kind != "token":
            return False
        token_names = names(principal)
        revoked, mark = self._local(token_names)
        if revoked:
            return True
        read_revoked, read_mark = await self._seen.get(token_names,
                                                       lambda: self.read(token_names))
        return read_revoked or _before(issued_at, mark, read_mark)

    async def revoked_now(self, principal: Principal) -> bool:
        """The same, read afresh, for an API key too (an issuer, under its lock: nothing
        cached)."""
        if principal.kind == "apikey":
            return (await self.read((f"key:{principal.id}",)))[0]
        if principal.kind != "token":
            return False
        token_names = names(principal)
        revoked, mark = await self.read(token_names)
        return revoked or _before(principal.issued_at, mark, self._local(token_names)[1])

    def _local(self, token_names: tuple[str, ...]) -> Marks:
        revoked, latest = False, None
        now = time.monotonic()
        for name in token_names:
            found = self._wrote.get(name)
            if found is None or now - found[0] > LOCAL_SECONDS:
                continue
            if name.startswith("sub:"):
                latest = found[1] if latest is None else max(latest, found[1])
            else:
                revoked = True
        return revoked, latest

    async def read(self, token_names: tuple[str, ...]) -> Marks:
        commands = [c for c in map(_command, token_names) if c is not None]
        replies = await self.auto.batch(commands)
        revoked, latest = False, None
        for command, reply in zip(commands, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            if command[0] == "EXISTS":
                revoked = revoked or int(reply) == 1
            elif reply is not None:
                latest = float(reply) if latest is None else max(latest, float(reply))
        return revoked, latest

    async def revoke(self, kind: str, value: str, ttl: int) -> None:
        """Mark ``jti``, ``key`` or ``fam`` ``value`` revoked for ``ttl`` seconds."""
        if ttl > 0:
            await self.durable.set(_MARKS[kind](value), "1", ex=ttl)
            self._wrote.put(f"{kind}:{value}", (time.monotonic(), 0.0))

    async def revoke_jti(self, jti: str, expires_at: float | None, longest: int) -> None:
        """Until the token would have expired (``longest`` seconds when that is unknown)."""
        await self.revoke("jti", jti, int((expires_at - time.time()) if expires_at
                                          else longest) + 1)

    async def revoke_sub(self, sub: str, longest: int) -> float:
        """Every token of ``sub`` issued until now; kept as long as such a token can live.
        Returns the mark (``repr`` keeps the float exact through Redis)."""
        now = time.time()
        await self.durable.set(keys.revoked_before(sub), repr(now), ex=longest + 1)
        self._wrote.put(f"sub:{sub}", (time.monotonic(), now))
        return now


def _before(issued_at: float | None, *marks: float | None) -> bool:
    """Was the token issued before the latest of these not-before marks?"""
    found = [m for m in marks if m is not None]
    return bool(found) and (issued_at or 0.0) < max(found)
