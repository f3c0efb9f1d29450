"""Maintenance mode: the ``lock:maintenance`` lease, held by the operator's command.

While it is on, inbound routes answer 503 with ``Retry-After``, workers take nothing new, the
Mattermost listener stays off its socket (its catch-up answers afterwards) and ``/readyz``
answers 503; reads keep working. The lease expires on its own (``--for``), so a forgotten
``maintenance on`` ends by itself. Its reason lives beside it in ``lock:{maintenance}:reason``
with the same TTL.

Every process reads the state through ``MaintenanceView``: at most one Redis read per
``REFRESH_SECONDS`` whatever the request rate, so every replica and worker sees a change
within that bound (plus one read).
"""

from __future__ import annotations

import asyncio
import json
import weakref
from dataclasses import dataclass
from typing import Any

from gateway import keys
from gateway.leases import lease as leases
from gateway.stores.redis import AnyRedis
from gateway.stores.refreshed import Refreshed

NAME = "maintenance"
HOLDER = "maintenance"  # one holder for every operator: `on` again extends, `off` ends it
DEFAULT_SECONDS = 3600
REFRESH_SECONDS = 0.5


def reason_key() -> str:
    return keys.lock("{" + NAME + "}:reason")


@dataclass(frozen=True)
class State:
    on: bool
    reason: str | None = None
    expires_in: float | None = None  # seconds

    def to_json(self) -> dict[str, Any]:
        return {"on": self.on, "reason": self.reason, "expires_in": self.expires_in}

    @property
    def retry_after(self) -> int:
        """What to tell a sender: come back when it ends, but ask again within a minute."""
        return max(1, min(60, int(self.expires_in or 1)))


async def switch_on(redis: AnyRedis, reason: str, seconds: float = DEFAULT_SECONDS) -> State:
    """Take (or extend) the lease for ``seconds`` with ``reason``."""
    lease = await leases.acquire(redis, NAME, HOLDER, seconds)
    if lease is None:  # held under another holder name: not one of ours
        raise RuntimeError("lock:maintenance is held by something else")
    await redis.set(reason_key(), reason, px=max(1, int(seconds * 1000)))
    return await read(redis)


async def switch_off(redis: AnyRedis) -> State:
    held = await leases.current(redis, NAME)
    if held is not None and held[0] == HOLDER:
        await leases.release(redis, leases.Lease(NAME, HOLDER, held[1], 0, 0))
    await redis.delete(reason_key())
    return await read(redis)


async def read(redis: AnyRedis) -> State:
    if await leases.current(redis, NAME) is None:
        return State(False)
    ttl_ms = await redis.pttl(leases.lease_key(NAME))
    reason = await redis.get(reason_key())
    if isinstance(reason, bytes):
        reason = reason.decode()
    return State(True, reason or "maintenance", round(ttl_ms / 1000, 1) if ttl_ms > 0 else None)


class MaintenanceView:
    """A process's view of the switch, read from Redis at most every ``REFRESH_SECONDS``;
    concurrent callers share one read. A failed read keeps the last state (the store that
    failed will answer the request itself)."""

    def __init__(self, redis: AnyRedis) -> None:
        self.redis = redis
        self._state = Refreshed(lambda: read(redis), State(False), REFRESH_SECONDS)

    @property
    def state(self) -> State:
        return self._state.value

    @property
    def reads(self) -> int:
        """Redis reads made, for tests and operators."""
        return self._state.reads

    async def current(self) -> State:
        return await self._state.get()

    @property
    def fresh(self) -> bool:
        """``state`` is recent enough to answer without awaiting ``current``."""
        return self._state.fresh

    async def wait_until_off(self) -> None:
        """Return once maintenance is off (at once when it is): the state lives in Redis, so
        this polls it at the view's refresh interval."""
        while True:
            if not (await self.current()).on:
                return
            await asyncio.sleep(REFRESH_SECONDS)


_views: weakref.WeakKeyDictionary[Any, MaintenanceView] = weakref.WeakKeyDictionary()


def view_for(redis: AnyRedis) -> MaintenanceView:
    """The one view of a durable client (so every component of a process shares its reads)."""
    view = _views.get(redis)
    if view is None:
        view = _views[redis] = MaintenanceView(redis)
    return view


def status_line(state: State) -> str:
    return json.dumps(state.to_json())
