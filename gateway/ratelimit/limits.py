"""Default limits and their configuration.

Platform limits apply to every outbound bot message; provider limits are for handlers that
call model providers. Both can be overridden in the TOML file::

    [ratelimit.platforms.telegram.chat]
    rate = 1
    period = 1
    burst = 1

    [ratelimit.providers.openrouter]
    requests_per_minute = 200
    tokens_per_minute = 100000
    concurrent = 10
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gateway.config import ConfigError, Settings
from gateway.ratelimit.limiter import Group, Limiter, Slot, Window


@dataclass(frozen=True)
class Rate:
    """``rate`` units per ``period`` seconds, at most ``burst`` of them back to back."""

    rate: float
    period: float
    burst: int = 1


# Telegram: ~30 messages/s per bot, 1/s per chat, 20/min per group (an edit counts like a
# message); Slack: ~1/s per channel, and chat.update is a Tier 3 method (~50/min per
# workspace): the "edit" scope, which only edits pass. Mattermost publishes no bot limit;
# 10/s per bot is the server's default per-user API rate.
PLATFORM_LIMITS: dict[str, dict[str, Rate]] = {
    "telegram": {"bot": Rate(30, 1.0), "chat": Rate(1, 1.0), "group": Rate(20, 60.0, 20)},
    "slack": {"channel": Rate(1, 1.0), "edit": Rate(50, 60.0, 5)},
    "mattermost": {"bot": Rate(10, 1.0)},
}


@dataclass(frozen=True)
class ProviderLimits:
    """Requests and tokens per window (a minute, as providers publish them; tests shorten it
    with ``window_seconds``) and calls in flight at once."""

    requests_per_minute: int
    tokens_per_minute: int
    concurrent: int
    window_seconds: float = 60.0


PROVIDER_LIMITS: dict[str, ProviderLimits] = {
    "openrouter": ProviderLimits(200, 100_000, 10),
    "anthropic": ProviderLimits(60, 80_000, 5),
    "google": ProviderLimits(60, 60_000, 5),
    "groq": ProviderLimits(30, 30_000, 3),
    "cerebras": ProviderLimits(30, 20_000, 3),
    "deepseek": ProviderLimits(60, 50_000, 5),
}


def _number(where: str, value: Any, *, integer: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(where, "must be a positive number")
    if integer and int(value) != value:
        raise ConfigError(where, "must be a positive integer")
    return int(value) if integer else float(value)


def platform_limits(settings: Settings) -> dict[str, dict[str, Rate]]:
    """The platform table with ``[ratelimit.platforms.<platform>.<scope>]`` overrides."""
    table = {platform: dict(scopes) for platform, scopes in PLATFORM_LIMITS.items()}
    overrides = settings.section("ratelimit").get("platforms", {})
    for platform, scopes in (overrides or {}).items():
        for scope, spec in (scopes or {}).items():
            where = f"[ratelimit.platforms.{platform}.{scope}]"
            if not isinstance(spec, Mapping):
                raise ConfigError(where, "must be a table with rate, period, burst")
            base = table.setdefault(platform, {}).get(scope, Rate(1, 1.0))
            table[platform][scope] = Rate(
                _number(f"{where}.rate", spec.get("rate", base.rate)),
                _number(f"{where}.period", spec.get("period", base.period)),
                _number(f"{where}.burst", spec.get("burst", base.burst), integer=True))
    return table


DEFAULT_PROVIDER_LIMITS = ProviderLimits(60, 60_000, 5)


def provider_limits(settings: Settings) -> dict[str, ProviderLimits]:
    """The provider table with overrides or additions from ``[ratelimit.providers.<name>]``
    and then ``[providers.<name>]`` (the provider's own table, DESIGN 8), which wins."""
    table = dict(PROVIDER_LIMITS)
    for section, prefix in ((settings.section("ratelimit").get("providers", {}), "ratelimit."),
                            (settings.section("providers"), "")):
        for name, spec in (section or {}).items():
            where = f"[{prefix}providers.{name}]"
            if not isinstance(spec, Mapping):
                raise ConfigError(where, "must be a table")
            base = table.get(name, DEFAULT_PROVIDER_LIMITS)
            changes: dict[str, Any] = {
                field: _number(f"{where}.{field}", spec[field], integer=True)
                for field in ("requests_per_minute", "tokens_per_minute", "concurrent")
                if field in spec}
            if "window_seconds" in spec:
                changes["window_seconds"] = _number(f"{where}.window_seconds",
                                                    spec["window_seconds"])
            table[name] = replace(base, **changes)
    return table


class Ticket:
    """An admitted provider call: ``settle(tokens)`` replaces the token estimate it was
    admitted on with the count the provider reported, at the same admission time. The
    correction goes out when the call ends, with its slot's release, in one script call
    (``finish``, or ``finish_nowait``)."""

    __slots__ = ("_attempt", "_estimate", "_group", "_limiter", "_settled", "tokens")

    def __init__(self, limiter: Limiter, group: Group, estimate: int, attempt: str) -> None:
        self._limiter = limiter
        self._group = group
        self._estimate = estimate
        self._attempt = attempt
        self._settled: int | None = None
        self.tokens = estimate

    async def settle(self, tokens: int) -> None:
        """Count ``tokens`` instead of the estimate (sent with the slot's release)."""
        self._settled = None if tokens == self._estimate else max(0, tokens)
        self.tokens = max(0, tokens)

    async def finish(self) -> None:
        """The settled tokens, if any, and the slot given back: one script call."""
        await self._limiter.amend_group(self._group, "tokens", self._attempt, self._estimate,
                                        self._settled, release=True)

    def finish_nowait(self) -> None:
        """``finish`` without waiting for Redis to answer (``Limiter.amend_nowait``): sent
        with the next flush, ahead of this process's next admission. Lost only with its
        flush (a connection lost or timed out, logged), as an awaited one whose error was
        suppressed: the estimate then stands and the slot's lease frees it."""
        self._limiter.amend_nowait(self._group, "tokens", self._attempt, self._estimate,
                                   self._settled, release=True)


class Providers:
    """The public API for handlers that call model providers.

    ``async with providers.call("anthropic", tokens=1200) as ticket: ...`` waits until one
    of the concurrent slots, a request and ``tokens`` in the window are all free at one
    instant, and takes the three in one script call, so what is admitted in a window is sent
    in it (taken one after the other, a request admitted while its tokens waited would go
    out beside the next window's). All on shared Redis state: every replica counts against
    the same budget. ``ticket.settle(n)`` corrects the tokens once the provider has said how
    many it counted; the correction and the slot's release are one script call at the
    block's end. ``admit`` and ``Ticket.finish_nowait`` are the same without the block and
    without waiting for the release (the chain's).
    ``cool_down(provider, seconds)`` (a 429's ``Retry-After``) holds back every ``call`` of
    that provider, on every replica, until it is over.
    """

    def __init__(self, limiter: Limiter, table: Mapping[str, ProviderLimits]) -> None:
        self.limiter = limiter
        self.table = dict(table)
        # (provider, lease) -> its group and token budget, built once per process
        self._groups: dict[tuple[str, float], tuple[Group, int]] = {}

    def limits(self, provider: str) -> ProviderLimits:
        try:
            return self.table[provider]
        except KeyError:
            raise KeyError(f"unknown provider {provider!r}; configure "
                           f"[providers.{provider}]") from None

    def _group(self, provider: str, lease: float) -> tuple[Group, int]:
        found = self._groups.get((provider, lease))
        if found is None:
            limits = self.limits(provider)
            windows = [Window("requests", limits.requests_per_minute, limits.window_seconds, 1),
                       Window("tokens", limits.tokens_per_minute, limits.window_seconds, 0)]
            found = (Group(_tag(provider), windows, cooldown=True,
                           slot=Slot(limits.concurrent, lease)), limits.tokens_per_minute)
            self._groups[(provider, lease)] = found
        return found

    async def admit(self, provider: str, *, tokens: int = 0, lease: float = 300.0,
                    max_cooldown: float | None = None) -> Ticket:
        """``call`` without the block: the caller gives the slot back with the ticket's
        ``finish`` or ``finish_nowait`` (or its lease does)."""
        group, budget = self._group(provider, lease)
        cost = min(max(0, int(tokens)), budget)
        attempt = await self.limiter.acquire_group(group, (1, cost), max_cooldown=max_cooldown)
        return Ticket(self.limiter, group, cost, attempt)

    @contextlib.asynccontextmanager
    async def call(self, provider: str, *, tokens: int = 0, lease: float = 300.0,
                   max_cooldown: float | None = None) -> AsyncIterator[Ticket]:
        """``tokens`` above the window's whole budget are counted as the whole budget (the
        call then has the window to itself) rather than refused forever. The provider's
        cool-down (``cool_down``) is waited out with the windows, in the same script call;
        with more of it left than ``max_cooldown``, ``CoolingDown`` is raised at once."""
        ticket = await self.admit(provider, tokens=tokens, lease=lease,
                                  max_cooldown=max_cooldown)
        try:
            yield ticket
        finally:
            with contextlib.suppress(Exception):  # the lease frees the slot, at worst
                await ticket.finish()

    async def cool_down(self, provider: str, seconds: float) -> None:
        """The provider said wait (a 429's ``Retry-After``): no call of any caller on any
        replica is admitted for ``seconds`` (at most ``MAX_COOLDOWN_SECONDS``)."""
        await self.limiter.cool_down(_tag(provider), min(seconds, MAX_COOLDOWN_SECONDS))


# A Retry-After longer than this is taken as this long: after it, one call asks again.
MAX_COOLDOWN_SECONDS = 3600.0


def _tag(provider: str) -> str:
    return f"provider:{provider}"
