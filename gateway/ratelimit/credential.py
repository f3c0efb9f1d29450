"""A limit per credential (or per account) on one kind of request, in ``rl:``: past it the
request is refused with 429 + ``Retry-After``, so one client cannot crowd out the others.
Job submissions (``[access] jobs_per_minute``) and link codes (``[access]
link_codes_per_hour``) use it."""

from __future__ import annotations

import math

from gateway.api.errors import ApiError
from gateway.ratelimit.limiter import Limiter


class CredentialRate:
    """``limit`` requests of kind ``name`` per ``period`` seconds for each owner; 0: none."""

    def __init__(self, limiter: Limiter, name: str, limit: int, period: float,
                 what: str) -> None:
        self.limiter = limiter
        self.name = name
        self.limit = limit
        self.period = period
        self.what = what  # e.g. "jobs a minute for this credential", for the refusal

    async def admit(self, owner: str) -> None:
        if not self.limit:
            return
        decision = await self.limiter.check(f"{self.name}:{owner}", rate=self.limit,
                                            period=self.period, burst=self.limit)
        if not decision.admitted:
            raise ApiError(429, "rate_limited", f"more than {self.limit} {self.what}",
                           {"Retry-After": str(max(1, math.ceil(decision.wait)))})
