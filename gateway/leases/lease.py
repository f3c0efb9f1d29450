"""Single-holder leases with fencing tokens in ``lock:`` on redis-durable (no Redlock).

A lease is a hash ``lock:{name}`` = ``{holder, token}`` with a TTL. Acquiring a free lease
increments a counter ``lock:{name}:fence`` (same hash tag, so the scripts run on Redis Cluster)
and stores the new value as the fencing token: every new holder gets a strictly larger token,
so a stale holder can always be told apart from its successor. Renew and release act only
for the holder of the token; a holder whose lease expired never gets it back by renewing.

The holder also keeps a local deadline (the lease TTL counted from *before* the request was
sent): when it cannot reach Redis to renew, it stops acting once that deadline passes, before
any successor can have acquired the lease.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from gateway import keys
from gateway.stores.redis import AnyRedis

_DIR = Path(__file__).parent / "lua"
_ACQUIRE = (_DIR / "acquire.lua").read_text()
_RENEW = (_DIR / "renew.lua").read_text()
_RELEASE = (_DIR / "release.lua").read_text()

# The fencing counter outlives any lease by far; it only has a TTL because every `lock:` key
# must expire (key registry). Every acquire and renew extends it, so it can only expire after
# a week without any holder, when restarting the count is harmless.
FENCE_TTL_MS = 7 * 24 * 3600 * 1000


def instance_id() -> str:
    """A holder id that names the process for operators and is unique across restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def lease_key(name: str) -> str:
    return keys.lock(f"{{{name}}}")


def fence_key(name: str) -> str:
    return keys.lock(f"{{{name}}}:fence")


@dataclass
class Lease:
    """A lease we hold: its fencing token and the local monotonic time it surely lasts until."""

    name: str
    holder: str
    token: int
    ttl: float
    valid_until: float

    def locally_valid(self) -> bool:
        return time.monotonic() < self.valid_until


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


async def acquire(redis: AnyRedis, name: str, holder: str, ttl: float) -> Lease | None:
    """Take the lease if it is free (or already ours); ``None`` while someone else holds it."""
    started = time.monotonic()
    token = await redis.eval(_ACQUIRE, 2, lease_key(name), fence_key(name),
                             holder, _ms(ttl), FENCE_TTL_MS)
    if token is None:
        return None
    return Lease(name, holder, int(token), ttl, started + ttl)


def _renew_args(lease: Lease) -> tuple[str, int, str, str, str, str, int, int]:
    return (_RENEW, 2, lease_key(lease.name), fence_key(lease.name), lease.holder,
            str(lease.token), _ms(lease.ttl), FENCE_TTL_MS)


def _renewed(lease: Lease, ok: object, started: float) -> bool:
    lease.valid_until = started + lease.ttl if ok else 0.0
    return bool(ok)


async def renew(redis: AnyRedis, lease: Lease) -> bool:
    """Extend the lease; ``False`` means it is lost (expired or taken) and must not be used."""
    started = time.monotonic()
    return _renewed(lease, await redis.eval(*_renew_args(lease)), started)


async def renew_many(redis: AnyRedis, held: list[Lease]) -> list[bool]:
    """``renew`` for several leases in one round trip (a holder of many, such as the
    notification partitions); each answer as ``renew``'s."""
    if not held:
        return []
    started = time.monotonic()
    async with redis.pipeline(transaction=False) as pipe:
        for lease in held:
            pipe.eval(*_renew_args(lease))
        answers = await pipe.execute()
    return [_renewed(lease, ok, started) for lease, ok in zip(held, answers, strict=True)]


async def release(redis: AnyRedis, lease: Lease) -> bool:
    """Give the lease up so a standby takes over at once instead of after the TTL."""
    lease.valid_until = 0.0
    return bool(await redis.eval(_RELEASE, 1, lease_key(lease.name),
                                 lease.holder, str(lease.token)))


async def holds(redis: AnyRedis, lease: Lease) -> bool:
    """The fencing check before a side effect: is this token still the current one?"""
    if not lease.locally_valid():
        return False
    holder, token = await redis.hmget(lease_key(lease.name), ["holder", "token"])
    return holder == lease.holder and token == str(lease.token)


async def current(redis: AnyRedis, name: str) -> tuple[str, int] | None:
    """``(holder, token)`` of the lease right now, or ``None`` when nobody holds it."""
    holder, token = await redis.hmget(lease_key(name), ["holder", "token"])
    if holder is None or token is None:
        return None
    return str(holder), int(token)
