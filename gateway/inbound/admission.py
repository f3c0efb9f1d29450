"""Admission by class on redis-durable's memory: the last of it is kept for what matters most.

Jobs are refused first (``[admission] jobs`` = 0.70 of ``maxmemory``), signed webhooks next
(``webhooks`` = 0.85); chat platform events are never refused here, only by the instance
being full. A client that floods jobs therefore cannot take the memory the bots' users and
the webhook senders need. Refusals are 503 + ``Retry-After`` (the sender retries once workers
drain the queues). The ratio is read at most every ``REFRESH_SECONDS`` per process (one
``INFO memory``; on a cluster every primary, the fullest counts); a failed read keeps the
last value, and without ``maxmemory`` nothing is refused here.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster

from gateway.api.errors import RETRY_AFTER_SECONDS, ApiError
from gateway.stores.redis import AnyRedis
from gateway.stores.refreshed import Refreshed

REFRESH_SECONDS = 0.5
DEFAULTS = {"jobs": 0.70, "webhooks": 0.85}


class Admission:
    def __init__(self, durable: AnyRedis, section: Any) -> None:
        self.durable = durable
        self.thresholds = {cls: float(section.get(cls, default))
                           for cls, default in DEFAULTS.items()}
        for cls, value in self.thresholds.items():
            if not 0 < value <= 1:
                raise ValueError(f"[admission] {cls} must be a fraction in (0, 1]")
        self._ratio: Refreshed[float | None] = Refreshed(self._read, None, REFRESH_SECONDS)

    @property
    def ratio(self) -> float | None:
        return self._ratio.value

    async def _read(self) -> float | None:
        kwargs = ({"target_nodes": RedisCluster.PRIMARIES}
                  if isinstance(self.durable, RedisCluster) else {})
        info: Any = await self.durable.info("memory", **kwargs)
        nodes = [info] if "used_memory" in info else list(info.values())
        ratios = [int(n["used_memory"]) / int(n["maxmemory"]) for n in nodes
                  if isinstance(n, dict) and int(n.get("maxmemory") or 0) > 0]
        return max(ratios) if ratios else None

    async def current(self) -> float | None:
        """The durable instance's ``used_memory / maxmemory`` (None: unbounded)."""
        return await self._ratio.get()

    async def admit(self, cls: str) -> None:
        ratio = await self.current()
        threshold = self.thresholds[cls]
        if ratio is not None and ratio >= threshold:
            raise ApiError(503, "backpressure",
                           f"redis-durable is {ratio:.0%} full: {cls} are refused above "
                           f"{threshold:.0%} until the queues drain",
                           {"Retry-After": str(RETRY_AFTER_SECONDS)})

    async def state(self) -> dict[str, Any]:
        """For the dashboard: how full, and which classes are refused now."""
        ratio = await self.current()
        closed = [] if ratio is None else [cls for cls, threshold in self.thresholds.items()
                                           if ratio >= threshold]
        return {"ratio": None if ratio is None else round(ratio, 3), "closed": closed,
                "thresholds": self.thresholds}

    async def readiness(self) -> tuple[bool, str]:
        """Not required: a replica with closed admission still serves what it admits."""
        ratio = await self.current()
        if ratio is None:
            return True, "no maxmemory: nothing refused by class"
        closed = [cls for cls, threshold in self.thresholds.items() if ratio >= threshold]
        state = f"closed for {', '.join(closed)}" if closed else "open"
        return not closed, f"redis-durable {ratio:.0%} full; admission {state}"
