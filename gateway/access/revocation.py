"""Early revocation of stateless access tokens: ``bl:jti:<jti>`` (until the token would have
expired) and ``bl:sub:<sub>`` = a not-before time (tokens of that account issued earlier are
refused). Checking costs no round trip per request: each process remembers what it read for
``CACHE_SECONDS``, so a revocation holds on every replica within that bound (1 s), and reads
for concurrent requests share one round trip through the coalescer."""

from __future__ import annotations

import time

from gateway import keys
from gateway.access.bounded import Bounded
from gateway.access.principal import Principal
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.redis import AnyRedis

CACHE_SECONDS = 1.0
CACHE_ENTRIES = 10_000  # bounded however many distinct tokens a client presents


class Revocations:
    def __init__(self, durable: AnyRedis) -> None:
        self.durable = durable
        self.auto = AutoPipeline(durable)
        self._seen: Bounded[tuple[str | None, str], tuple[float, bool]] = Bounded(CACHE_ENTRIES)

    async def revoked(self, principal: Principal, issued_at: float | None) -> bool:
        """Is this token revoked (its jti, or its account since after it was issued)?"""
        if principal.kind != "token":
            return False
        key = (principal.jti, principal.id)
        now = time.monotonic()
        cached = self._seen.get(key)
        if cached is not None and now - cached[0] < CACHE_SECONDS:
            return cached[1]
        jti_mark, not_before = await self.auto.batch([
            ("EXISTS", keys.revoked_jti(principal.jti)) if principal.jti else ("ECHO", "0"),
            ("GET", keys.revoked_before(principal.id))])
        for reply in (jti_mark, not_before):
            if isinstance(reply, Exception):
                raise reply
        revoked = int(jti_mark) == 1 or (
            not_before is not None and (issued_at or 0) < float(not_before))
        self._seen.put(key, (now, revoked))
        return revoked

    async def revoke_jti(self, jti: str, expires_at: float | None, longest: int) -> None:
        """Until the token would have expired (``longest`` seconds when that is unknown)."""
        ttl = int((expires_at - time.time()) if expires_at else longest) + 1
        if ttl > 0:
            await self.durable.set(keys.revoked_jti(jti), "1", ex=ttl)

    async def revoke_sub(self, sub: str, longest: int) -> None:
        """Every token of ``sub`` issued until now; kept as long as such a token can live."""
        await self.durable.set(keys.revoked_before(sub), str(time.time()), ex=longest + 1)
