"""Brute-force barrier: a client that keeps failing signature checks is refused for a while.

Per client address, failures are counted in a fixed window (``brute:{ip}:fail``); at the
threshold the address is blocked for a cool-down (``brute:{ip}:block``) and every request
from it gets 429 until then, signed or not, while other senders are unaffected. Both keys of
one address share a hash tag so the counting script also runs on Redis Cluster. A fixed
window is enough here: the barrier bounds guessing, it does not meter a rate.

The client address is the TCP peer, unless the peer is a configured trusted proxy; then it is
the right-most ``X-Forwarded-For`` entry that is not itself a trusted proxy (never the
left-most, which the client writes), over every line of the header, in every form
(``gateway.security.forwarded``). An IPv6 address counts by its /64, since one host holds
a whole /64. A request through trusted proxies that names no client (no entry beyond the
proxies, or garbage) is neither checked nor counted: a proxy is never blocked, so nobody can
lock out every sender behind it.

What counts as a failure, one each: on the signed routes, a missing or malformed signature
header (garbage: no platform sends it) and a well-formed signature that does not match (a
guess at the secret, or a sender with the wrong one); every refused credential (401)
elsewhere. What does not count: a signature that matches but whose signed timestamp is
stale (a replay or a skewed clock: it proves a genuine request, guesses nothing), a correctly
signed request with an unusable id or body (400), a stale payload (400). A platform's
sending addresses are shared by all its customers, and anyone can point a webhook or a bot
of their own at this gateway with a wrong secret; ``never_block`` lists such ranges (e.g.
GitHub's hook ranges from ``api.github.com/meta``, Telegram's 149.154.160.0/20 and
91.108.4.0/22): their failures are still refused with 401 but neither counted nor blocked,
so someone else's misconfigured hook cannot get the platform's deliveries to us refused.
Configuration (TOML ``[security]``): ``brute_max_failures`` (10), ``brute_window`` (60 s),
``brute_cooldown`` (300 s), ``trusted_proxies`` (addresses or networks, default none),
``never_block`` (addresses or networks, default none), ``brute_cache_seconds`` (1 s, see
``BruteBarrier``). Under ``gateway dev`` (``exempt_loopback``, never set by ``serve``) loopback
clients are neither checked nor counted: on a developer's own machine a few wrong credentials
must not lock the developer out of their own stack. Blocks are listed and lifted by
``gateway barrier`` and ``/v1/admin/barrier`` (``gateway.security.blocks``).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
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
from gateway.security import forwarded
from gateway.stores.coalesce import AutoPipeline

log = logging.getLogger("gateway.security")
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
    never_block: tuple[Network, ...] = ()
    # `gateway dev` only: loopback clients are neither checked nor counted.
    exempt_loopback: bool = False

    @classmethod
    def from_section(cls, section: Mapping[str, Any], *,
                     exempt_loopback: bool = False) -> BruteSettings:
        tuned = positive_numbers(section, _TUNABLE, "GATEWAY_CONFIG [security]",
                                 other=("trusted_proxies", "never_block"))
        return cls(
            exempt_loopback=exempt_loopback,
            max_failures=int(tuned.get("brute_max_failures", cls.max_failures)),
            window=int(tuned.get("brute_window", cls.window)),
            cooldown=int(tuned.get("brute_cooldown", cls.cooldown)),
            cache_seconds=float(tuned.get("brute_cache_seconds", cls.cache_seconds)),
            trusted_proxies=_networks(section, "trusted_proxies"),
            never_block=_networks(section, "never_block"),
        )


def _networks(section: Mapping[str, Any], name: str) -> tuple[Network, ...]:
    """A list (or comma-separated string) of addresses or networks."""
    entries = section.get(name, ())
    if isinstance(entries, str):
        entries = [p for p in entries.split(",") if p.strip()]
    try:
        return tuple(ipaddress.ip_network(p.strip(), strict=False) for p in entries)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"GATEWAY_CONFIG [security].{name}", str(exc)) from None


_TUNABLE = {"brute_max_failures": int, "brute_window": int, "brute_cooldown": int,
            "brute_cache_seconds": float}


def is_trusted(address: str, proxies: Iterable[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in proxies)


def is_loopback(address: str) -> bool:
    """127.0.0.0/8 or ::1, as ``group`` gives it (IPv6 by its /64: ``::/64`` holds ::1 and
    no other address a client can have)."""
    try:
        net = ipaddress.ip_network(address, strict=False)
    except ValueError:
        return False
    return net.is_loopback or (net.version == 6 and net.prefixlen >= 64
                               and _IPV6_LOOPBACK in net)


_IPV6_LOOPBACK = ipaddress.ip_address("::1")


NOBODY = ""  # no countable address: neither checked nor counted (a proxy is never blocked)


@functools.lru_cache(maxsize=4096)
def group(address: str) -> str:
    """What the barrier counts: an IPv4 address, or the /64 of an IPv6 one (one host holds a
    whole /64 and can rotate through it). Cached: parsing and printing the address cost
    ~8 µs, on every request of the ingest path, for the few addresses a sender uses."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def _client_address(request: web.Request, trusted_proxies: tuple[Network, ...]) -> str:
    peer = request.remote or "unknown"
    if not trusted_proxies or not is_trusted(peer, trusted_proxies):
        return peer
    found = forwarded.client(request.headers.getall("X-Forwarded-For", ()), trusted_proxies)
    return NOBODY if found is None else str(found)  # garbage: no client to count


def client_ip(request: web.Request, trusted_proxies: tuple[Network, ...],
              never_block: tuple[Network, ...] = ()) -> str:
    """The address the barrier counts for this request (see the module docstring):
    ``NOBODY`` when the request came through trusted proxies that name no client, so that
    garbage sent through a proxy never blocks everyone behind it, and for a client in
    ``never_block`` (a platform's shared sending ranges)."""
    address = _client_address(request, trusted_proxies)
    if address == NOBODY or (never_block and is_trusted(address, never_block)):
        return NOBODY
    return group(address)


class BruteBarrier:
    """Check before verifying, count after a failed verification.

    Redis holds the truth; each process also remembers, for ``cache_seconds`` (1 s), that an
    address was blocked (and until when) or was not, so a steady sender, blocked or not,
    costs one Redis read per address per second instead of one per request. A block set by
    another process is therefore honoured here at most ``cache_seconds`` late, and a block
    lifted by ``gateway barrier clear`` ends here as late.

    A new block is logged once, with the address, the failures that caused it and the
    cool-down, so an operator sees why a client gets 429 and how to lift it.
    """

    MAX_REMEMBERED = 10_000
    MAX_WARNED = 10

    def __init__(self, auto: AutoPipeline, config: BruteSettings) -> None:
        self.auto = auto
        self.config = config
        self._fail: AsyncScript = auto.redis.register_script(_FAIL)
        # address -> (end of its block, end of this process's trust in that answer)
        self._blocked_until: dict[str, tuple[float, float]] = {}
        self._clear_until: dict[str, float] = {}
        self._warned_forwarders: set[str] = set()

    def client_ip(self, request: web.Request) -> str:
        ip = client_ip(request, self.config.trusted_proxies, self.config.never_block)
        if ("X-Forwarded-For" in request.headers  # rare: the one check most requests make
                and len(self._warned_forwarders) < self.MAX_WARNED
                and ip not in self._warned_forwarders):
            self._warn_untrusted_forwarder(request, ip)
        return ip

    def _warn_untrusted_forwarder(self, request: web.Request, ip: str) -> None:
        """A peer that is not a trusted proxy sent ``X-Forwarded-For``: either a client
        forging it (ignored, rightly) or a reverse proxy missing from ``trusted_proxies``,
        which would get every client behind it blocked together. Said once per address, for
        at most ``MAX_WARNED`` addresses per process, so it cannot flood the log."""
        peer = request.remote or "unknown"
        if ip == NOBODY or is_trusted(peer, self.config.trusted_proxies):
            return
        self._warned_forwarders.add(ip)
        log.warning("%s sent X-Forwarded-For but is not in [security] trusted_proxies: the "
                    "barrier counts %s itself; if it is a reverse proxy, list it there, or "
                    "the clients behind it are blocked together", peer, ip)

    def _exempt(self, ip: str) -> bool:
        """Neither checked nor counted: no countable address, or a loopback client under
        ``gateway dev``."""
        return ip == NOBODY or (self.config.exempt_loopback and is_loopback(ip))

    def known_clear(self, ip: str) -> bool:
        """``check`` would pass ``ip`` without reading Redis (exempt, or found unblocked
        less than ``cache_seconds`` ago): the caller may skip awaiting it."""
        return self._exempt(ip) or self._clear_until.get(ip, 0.0) > time.monotonic()

    async def check(self, ip: str) -> None:
        """Raise 429 while ``ip`` is blocked."""
        if self._exempt(ip):
            return
        now = time.monotonic()
        until, checked = self._blocked_until.get(ip, (0.0, 0.0))
        if until > now and checked > now:
            raise self.refusal(math.ceil(until - now))
        if self._clear_until.get(ip, 0.0) > now:
            return
        remaining = int(await self.auto.execute("TTL", block_key(ip)))
        if remaining > 0:
            self._remember(self._blocked_until, ip,
                           (now + remaining, now + self.config.cache_seconds))
            raise self.refusal(remaining)
        self._blocked_until.pop(ip, None)
        self._remember(self._clear_until, ip, now + self.config.cache_seconds)

    async def record_failure(self, ip: str) -> int:
        """Count one failure; the cool-down in seconds when this one blocked the address."""
        if self._exempt(ip):
            return 0
        blocked = int(await self._fail(keys=[fail_key(ip), block_key(ip)],
                                       args=[self.config.max_failures, self.config.window,
                                             self.config.cooldown]))
        if blocked:
            now = time.monotonic()
            self._clear_until.pop(ip, None)
            self._remember(self._blocked_until, ip,
                           (now + blocked, now + self.config.cache_seconds))
            log.warning("barrier: %s blocked for %d s after %d failed signatures or "
                        "credentials within %d s (every request from it gets 429); "
                        "`gateway barrier clear %s` lifts it", ip, blocked,
                        self.config.max_failures, self.config.window, ip)
        return blocked

    def _remember(self, table: dict[str, Any], ip: str, until: Any) -> None:
        if len(table) >= self.MAX_REMEMBERED:
            table.clear()  # bounded memory under a flood of addresses; Redis still decides
        table[ip] = until

    @staticmethod
    def refusal(seconds: int) -> ApiError:
        return ApiError(429, "rate_limited",
                        "too many failed signatures or credentials from this address; "
                        "retry later",
                        {"Retry-After": str(seconds)})
