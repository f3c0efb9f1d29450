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
from gateway.ratelimit.limiter import Limiter


@dataclass(frozen=True)
class Rate:
    """``rate`` units per ``period`` seconds, at most ``burst`` of them back to back."""

    rate: float
    period: float
    burst: int = 1


# Telegram: ~30 messages/s per bot, 1/s per chat, 20/min per group; Slack: ~1/s per channel.
# Mattermost publishes no bot limit; 10/s per bot is the server's default per-user API rate.
PLATFORM_LIMITS: dict[str, dict[str, Rate]] = {
    "telegram": {"bot": Rate(30, 1.0), "chat": Rate(1, 1.0), "group": Rate(20, 60.0, 20)},
    "slack": {"channel": Rate(1, 1.0)},
    "mattermost": {"bot": Rate(10, 1.0)},
}


@dataclass(frozen=True)
class ProviderLimits:
    requests_per_minute: int
    tokens_per_minute: int
    concurrent: int


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


def provider_limits(settings: Settings) -> dict[str, ProviderLimits]:
    """The provider table with ``[ratelimit.providers.<name>]`` overrides or additions."""
    table = dict(PROVIDER_LIMITS)
    for name, spec in (settings.section("ratelimit").get("providers", {}) or {}).items():
        where = f"[ratelimit.providers.{name}]"
        if not isinstance(spec, Mapping):
            raise ConfigError(where, "must be a table")
        base = table.get(name, ProviderLimits(60, 60_000, 5))
        changes = {field: _number(f"{where}.{field}", spec[field], integer=True)
                   for field in ("requests_per_minute", "tokens_per_minute", "concurrent")
                   if field in spec}
        table[name] = replace(base, **changes)
    return table


class Providers:
    """The public API for handlers that call model providers.

    ``async with providers.call("anthropic", tokens=1200): ...`` waits for a request slot in
    the minute, for the tokens in the minute, and for one of the concurrent slots, in that
    order, all on shared Redis state so every replica counts against the same budget.
    """

    def __init__(self, limiter: Limiter, table: Mapping[str, ProviderLimits]) -> None:
        self.limiter = limiter
        self.table = dict(table)

    def limits(self, provider: str) -> ProviderLimits:
        try:
            return self.table[provider]
        except KeyError:
            raise KeyError(f"unknown provider {provider!r}; configure "
                           f"[ratelimit.providers.{provider}]") from None

    @contextlib.asynccontextmanager
    async def call(self, provider: str, *, tokens: int = 0,
                   lease: float = 300.0) -> AsyncIterator[None]:
        limits = self.limits(provider)
        await self.limiter.acquire(f"provider:{provider}:requests",
                                   rate=limits.requests_per_minute, period=60.0,
                                   burst=limits.requests_per_minute)
        if tokens > 0:
            await self.limiter.acquire(f"provider:{provider}:tokens",
                                       rate=limits.tokens_per_minute, period=60.0,
                                       burst=limits.tokens_per_minute, cost=tokens)
        async with self.limiter.slot(f"provider:{provider}:concurrent",
                                     limit=limits.concurrent, lease=lease):
            yield
