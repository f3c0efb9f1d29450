"""Brute-force barrier: a client that keeps failing signature checks is refused for a while.

Per client address, failures are counted in a fixed window (``brute:{ip}:fail``); at the
threshold the address is blocked for a cool-down (``brute:{ip}:block``) and every request
from it gets 429 until then, signed or not, while other senders are unaffected. Both keys of
one address share a hash tag so the counting script also runs on Redis Cluster. A fixed
window is enough here: the barrier bounds guessing, it does not meter a rate.

The client address is the TCP peer, unless the peer is a configured trusted proxy; then it is
the right-most ``X-Forwarded-For`` entry that is not itself a trusted proxy (never the
left-most, which the client writes). An IPv6 address counts by its /64, since one host holds
a whole /64. A request through trusted proxies that names no client (no entry beyond the
proxies, or garbage) is neither checked nor counted: a proxy is never blocked, so nobody can
lock out every sender behind it. What counts as a failure: a bad signature or secret on the
signed routes (a request whose shape is wrong is a 400 and counts nothing), and every refused
credential (401) elsewhere. Configuration
(TOML ``[security]``): ``brute_max_failures`` (10), ``brute_window`` (60 s),
``brute_cooldown`` (300 s), ``trusted_proxies`` (addresses or networks, default none),
``brute_cache_seconds`` (1 s, see ``BruteBarrier``).
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from redis.commands.core import AsyncScript

from gateway import keys
from gateway.api.errors import ApiError
from gateway.config import ConfigError, positive_numbers
from gateway.stores.coalesce import AutoPipeline

_FAIL = (Path(__file__).parent / "lua" / "brute_fail.lua").read_text()
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def fail_key(ip: str) -> str:
    return keys.brute("{" + ip + "}", "fail")


def block_key(ip: str) -> str:
    return keys.brute("{" + ip + "}", "block")


@dataclass(frozen=True)
class BruteSettings:
    max_failures: int = 10
    window: int = 60
    cooldown: int = 300
    trusted_proxies: tuple[Network, ...] = ()
    cache_seconds: float = 1.0

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> BruteSettings:
        proxies = section.get("trusted_proxies", ())
        if isinstance(proxies, str):
            proxies = [p for p in proxies.split(",") if p.strip()]
        tuned = positive_numbers(section, _TUNABLE, "GATEWAY_CONFIG [security]",
                                 other=("trusted_proxies",))
        try:
            networks = tuple(ipaddress.ip_network(p.strip(), strict=False) for p in proxies)
        except (TypeError, ValueError) as exc:
            raise ConfigError("GATEWAY_CONFIG [security].trusted_proxies", str(exc)) from None
        return cls(
            max_failures=int(tuned.get("brute_max_failures", cls.max_failures)),
            window=int(tuned.get("brute_window", cls.window)),
            cooldown=int(tuned.get("brute_cooldown", cls.cooldown)),
            cache_seconds=float(tuned.get("brute_cache_seconds", cls.cache_seconds)),
            trusted_proxies=networks,
        )


_TUNABLE = {"brute_max_failures": int, "brute_window": int, "brute_cooldown": int,
            "brute_cache_seconds": float}


def is_trusted(address: str, proxies: Iterable[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in proxies)


NOBODY = ""  # no countable address: neither checked nor counted (a proxy is never blocked)


def group(address: str) -> str:
    """What the barrier counts: an IPv4 address, or the /64 of an IPv6 one (one host holds a
    whole /64 and can rotate through it)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def client_ip(request: web.Request, trusted_proxies: tuple[Network, ...]) -> str:
    """The address the barrier counts for this request (see the module docstring):
    ``NOBODY`` when the request came through trusted proxies that name no client, so that
    garbage sent through a proxy never blocks everyone behind it."""
    peer = request.remote or "unknown"
    if not trusted_proxies or not is_trusted(peer, trusted_proxies):
        return group(peer)
    hops = [h.strip() for h in request.headers.get("X-Forwarded-For", "").split(",")]
    for hop in reversed([h for h in hops if h]):
        if not is_trusted(hop, trusted_proxies):
            try:
                return group(str(ipaddress.ip_address(hop)))
            except ValueError:
                return NOBODY  # a forged, unparsable entry: no client to count
    return NOBODY


class BruteBarrier:
    """Check before verifying, count after a failed verification.

    Redis holds the truth; each process also remembers the blocks it has seen until they end,
    and that an address was not blocked for ``cache_seconds`` (1 s), so a steady sender costs
    one Redis read per address per second instead of one per request. A block set by another
    process is therefore honoured here at most ``cache_seconds`` late.
    """

    MAX_REMEMBERED = 10_000

    def __init__(self, auto: AutoPipeline, config: BruteSettings) -> None:
        self.auto = auto
        self.config = config
        self._fail: AsyncScript = auto.redis.register_script(_FAIL)
        self._blocked_until: dict[str, float] = {}
        self._clear_until: dict[str, float] = {}

    def client_ip(self, request: web.Request) -> str:
        return client_ip(request, self.config.trusted_proxies)

    async def check(self, ip: str) -> None:
        """Raise 429 while ``ip`` is blocked."""
        if ip == NOBODY:
            return
        now = time.monotonic()
        until = self._blocked_until.get(ip, 0.0)
        if until > now:
            raise self.refusal(math.ceil(until - now))
        if self._clear_until.get(ip, 0.0) > now:
            return
        remaining = int(await self.auto.execute("TTL", block_key(ip)))
        if remaining > 0:
            self._remember(self._blocked_until, ip, now + remaining)
            raise self.refusal(remaining)
        self._remember(self._clear_until, ip, now + self.config.cache_seconds)

    async def record_failure(self, ip: str) -> int:
        """Count one failure; the cool-down in seconds when this one blocked the address."""
        if ip == NOBODY:
            return 0
        blocked = int(await self._fail(keys=[fail_key(ip), block_key(ip)],
                                       args=[self.config.max_failures, self.config.window,
                                             self.config.cooldown]))
        if blocked:
            self._clear_until.pop(ip, None)
            self._remember(self._blocked_until, ip, time.monotonic() + blocked)
        return blocked

    def _remember(self, table: dict[str, float], ip: str, until: float) -> None:
        if len(table) >= self.MAX_REMEMBERED:
            table.clear()  # bounded memory under a flood of addresses; Redis still decides
        table[ip] = until

    @staticmethod
    def refusal(seconds: int) -> ApiError:
        return ApiError(429, "rate_limited",
                        "too many failed signatures or credentials from this address; "
                        "retry later",
                        {"Retry-After": str(seconds)})
