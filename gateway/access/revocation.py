"""Early revocation of stateless access tokens: ``bl:jti:<jti>`` (until the token would have
expired) and ``bl:sub:<sub>`` = a not-before time (tokens of that account issued earlier are
refused). Checking costs no round trip per request: each process remembers what it read for
``CACHE_SECONDS``, so a revocation holds on every other process within that bound (1 s), and
reads for concurrent requests share one round trip through the coalescer. The process that
takes a revocation also keeps what it wrote (``_jtis``, ``_subs``, bounded, consulted on
every check), so there it holds from the next request.

The not-before mark is the revocation's ``time.time()`` and a token's ``iat`` is compared with
it exactly: the gateway mints ``iat`` with sub-second precision, so its tokens issued after the
revocation pass, even within the same second. A whole-second ``iat`` (an identity provider's)
counts as the start of its second: such a token issued in the second of the revocation is
refused with the older ones (it cannot be told apart from them); one of the next second
passes. A token without ``iat`` is refused once its account has a mark."""

from __future__ import annotations

import time

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


class Revocations:
    def __init__(self, durable: AnyRedis) -> None:
        self.durable = durable
        self.auto = AutoPipeline(durable)
        # (jti, sub) -> (jti revoked, the account's not-before or None). The marks, not a
        # verdict: tokens without a jti share an entry, each judged by its own iat.
        self._seen: Fresh[tuple[str | None, str], tuple[bool, float | None]] = Fresh(
            CACHE_SECONDS, CACHE_ENTRIES)
        # Written here: jti -> (monotonic time written, 0.0); sub -> (written, its mark).
        self._jtis: Bounded[str, tuple[float, float]] = Bounded(CACHE_ENTRIES)
        self._subs: Bounded[str, tuple[float, float]] = Bounded(CACHE_ENTRIES)

    async def revoked(self, principal: Principal, issued_at: float | None) -> bool:
        """Is this token revoked (its jti, or its account since after it was issued)?"""
        if principal.kind != "token":
            return False
        if principal.jti is not None and _recent(self._jtis, principal.jti) is not None:
            return True
        jti_revoked, mark = await self._seen.get(
            (principal.jti, principal.id), lambda: self._marks(principal))
        local = _recent(self._subs, principal.id)
        if local is not None:
            mark = local if mark is None else max(mark, local)
        return jti_revoked or (mark is not None and (issued_at or 0.0) < mark)

    async def _marks(self, principal: Principal) -> tuple[bool, float | None]:
        jti_mark, not_before = await self.auto.batch([
            ("EXISTS", keys.revoked_jti(principal.jti)) if principal.jti else ("ECHO", "0"),
            ("GET", keys.revoked_before(principal.id))])
        for reply in (jti_mark, not_before):
            if isinstance(reply, Exception):
                raise reply
        return int(jti_mark) == 1, float(not_before) if not_before is not None else None

    async def revoke_jti(self, jti: str, expires_at: float | None, longest: int) -> None:
        """Until the token would have expired (``longest`` seconds when that is unknown)."""
        ttl = int((expires_at - time.time()) if expires_at else longest) + 1
        if ttl > 0:
            await self.durable.set(keys.revoked_jti(jti), "1", ex=ttl)
            self._jtis.put(jti, (time.monotonic(), 0.0))

    async def revoke_sub(self, sub: str, longest: int) -> float:
        """Every token of ``sub`` issued until now; kept as long as such a token can live.
        Returns the mark (``repr`` keeps the float exact through Redis)."""
        now = time.time()
        await self.durable.set(keys.revoked_before(sub), repr(now), ex=longest + 1)
        self._subs.put(sub, (time.monotonic(), now))
        return now


def _recent(table: Bounded[str, tuple[float, float]], name: str) -> float | None:
    """The value this process wrote for ``name`` less than ``LOCAL_SECONDS`` ago."""
    found = table.get(name)
    if found is None or time.monotonic() - found[0] > LOCAL_SECONDS:
        return None
    return found[1]
