"""The listener's health flag ``cache:mattermost:listener`` in redis-cache.

Only the lease holder writes it: a heartbeat JSON ``{instance, connected, since,
last_event_at, reconnects}`` with a TTL, refreshed well inside that TTL. An expired key reads
as "not running", so a killed listener disappears by itself; nothing has to clean up after it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from gateway import keys
from gateway.api.state import ReadinessCheck
from gateway.stores.redis import AnyRedis
from gateway.stores.runtime import Runtime

DEFAULT_TTL = 90.0


@dataclass
class ListenerState:
    """What the flag says; ``since`` is when ``connected`` last changed (epoch seconds)."""

    instance: str
    connected: bool = False
    since: float = 0.0
    last_event_at: float | None = None
    reconnects: int = 0

    def set_connected(self, connected: bool) -> None:
        if connected != self.connected or not self.since:
            self.since = round(time.time(), 3)
        self.connected = connected

    def saw_event(self) -> None:
        self.last_event_at = round(time.time(), 3)


async def publish(cache: AnyRedis, state: ListenerState, ttl: float = DEFAULT_TTL) -> None:
    await cache.set(keys.mattermost_listener(), json.dumps(asdict(state)),
                    px=max(1, int(ttl * 1000)))


async def read(cache: AnyRedis) -> dict[str, Any] | None:
    """The flag, or ``None`` when it expired (no listener running) or is unreadable."""
    raw = await cache.get(keys.mattermost_listener())
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


async def clear(cache: AnyRedis, instance: str) -> None:
    """On a clean stop, drop the flag if it is ours (called before the lease is released, so
    no successor can have written it yet)."""
    flag = await read(cache)
    if flag is not None and flag.get("instance") == instance:
        await cache.delete(keys.mattermost_listener())


def readiness_check(runtime: Runtime) -> ReadinessCheck:
    """A ``/readyz`` entry: ok while some replica's listener is connected."""

    async def check() -> tuple[bool, str]:
        flag = await read(runtime.cache)
        if flag is None:
            return False, "not running (no heartbeat)"
        state = "connected" if flag.get("connected") else "disconnected"
        return bool(flag.get("connected")), (
            f"{state} on {flag.get('instance')} since {flag.get('since')}, "
            f"last event {flag.get('last_event_at')}, reconnects {flag.get('reconnects')}")

    return check
