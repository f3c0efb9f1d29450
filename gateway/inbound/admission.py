"""Admission by class on redis-durable's memory: the last of it is kept for what matters most.

Jobs are refused first (``[admission] jobs`` = 0.70 of ``maxmemory``), signed webhooks next
(``webhooks`` = 0.85); chat platform events are never refused here, only by the instance
being full. A client that floods jobs therefore cannot take the memory the bots' users and
the webhook senders need. Refusals are 503 + ``Retry-After`` (the sender retries once workers
drain the queues).

Two checks, both needed. *Exact*: the pipeline's ADD counts what the items of every class
hold (``q:{pipeline}:held``, an estimate of their memory) in the same call that enqueues, and
refuses an item when everything held would pass its class's fraction of ``maxmemory``
(``AdmissionClass``), so no burst, however concurrent, passes a threshold. *Coarse*: the
instance's own ``used_memory / maxmemory``, read at most every ``REFRESH_SECONDS`` per process
(one ``INFO memory``; on a cluster every primary, the fullest counts), catches memory the
pipeline does not hold (inboxes, claims, buffers); a failed read keeps the last value. Without
``maxmemory`` nothing is refused here.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster

from gateway.api.errors import RETRY_AFTER_SECONDS, ApiError
from gateway.pipeline.queue import AdmissionClass
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
        # The smallest maxmemory of the instance's primaries, from the last read (None:
        # unbounded, or not read yet); the classes' limits and scaled quotas follow it.
        self.maxmemory: int | None = None
        self._classes: dict[tuple[str, int | None], AdmissionClass] = {}

    @property
    def ratio(self) -> float | None:
        return self._ratio.value

    async def _read(self) -> float | None:
        kwargs = ({"target_nodes": RedisCluster.PRIMARIES}
                  if isinstance(self.durable, RedisCluster) else {})
        info: Any = await self.durable.info("memory", **kwargs)
        nodes = [info] if "used_memory" in info else list(info.values())
        bounded = [n for n in nodes if isinstance(n, dict) and int(n.get("maxmemory") or 0) > 0]
        self.maxmemory = min(int(n["maxmemory"]) for n in bounded) if bounded else None
        ratios = [int(n["used_memory"]) / int(n["maxmemory"]) for n in bounded]
        return max(ratios) if ratios else None

    async def current(self) -> float | None:
        """The durable instance's ``used_memory / maxmemory`` (None: unbounded)."""
        return await self._ratio.get()

    async def admit(self, cls: str) -> AdmissionClass:
        """The coarse check (503 past the class's threshold of the instance's memory), then
        what ADD needs for the exact one: the class, and its limit of what the pipeline may
        hold (``threshold * maxmemory``; 0, counted only, without maxmemory)."""
        return self._admit(cls, await self.current())

    def admitted_now(self, cls: str) -> AdmissionClass | None:
        """``admit`` without an await while the last read is fresh and admits ``cls`` (the
        ingest path's common case); None when ``admit`` must be awaited instead."""
        if not self._ratio.fresh:
            return None
        ratio = self._ratio.value
        if ratio is not None and ratio >= self.thresholds[cls]:
            return None
        return self._admit(cls, ratio)

    def _admit(self, cls: str, ratio: float | None) -> AdmissionClass:
        threshold = self.thresholds[cls]
        if ratio is not None and ratio >= threshold:
            raise ApiError(503, "backpressure",
                           f"redis-durable is {ratio:.0%} full: {cls} are refused above "
                           f"{threshold:.0%} until the queues drain",
                           {"Retry-After": str(RETRY_AFTER_SECONDS)})
        made = self._classes.get((cls, self.maxmemory))
        if made is None:  # once per class and maxmemory, not per request
            made = self._classes[cls, self.maxmemory] = AdmissionClass(
                cls, int(threshold * self.maxmemory) if self.maxmemory else 0)
        return made

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

