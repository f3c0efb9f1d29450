"""The configured providers of one process: their clients on one HTTP session, their limits,
the usage ledger, and chains built from names (``[conversations] providers = ["a", "b"]``,
``[pipeline] embedder = "a:model"``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import asyncpg

from gateway.config import ConfigError, Settings
from gateway.providers.chain import Chain
from gateway.providers.client import OpenAIClient
from gateway.providers.config import ProviderConfig, provider_configs
from gateway.providers.usage import UsageLedger, budgets
from gateway.ratelimit.limiter import Limiter
from gateway.ratelimit.limits import Providers
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.redis import AnyRedis


class ModelProviders:
    """Build with ``ModelProviders.from_settings(settings, runtime.durable, runtime.pg)``;
    ``chain(["groq", "openrouter"])`` for calls; ``await close()`` at shutdown."""

    def __init__(self, configs: Mapping[str, ProviderConfig], limiter: Limiter,
                 ledger: UsageLedger | None) -> None:
        self.configs = dict(configs)
        self.limits = Providers(limiter, {name: c.limits for name, c in configs.items()})
        self.ledger = ledger
        self._session: aiohttp.ClientSession | None = None
        self._clients: dict[str, OpenAIClient] = {}

    @classmethod
    def from_settings(cls, settings: Settings, durable: AnyRedis,
                      pool: asyncpg.Pool | None,
                      environ: Mapping[str, str] | None = None) -> ModelProviders:
        """``pool`` None: no usage rows and no budgets (tools that only need the clients)."""
        ledger = UsageLedger(pool, budgets(settings)) if pool is not None else None
        # The limiter's scripts of concurrent calls share round trips (two per call).
        limiter = Limiter(durable, AutoPipeline(durable))
        return cls(provider_configs(settings, environ), limiter, ledger)

    def client(self, name: str) -> OpenAIClient:
        if name not in self.configs:
            raise ConfigError(f"[providers.{name}]", "is not configured")
        if name not in self._clients:
            if self._session is None:  # made on first use, inside the running loop
                self._session = aiohttp.ClientSession()
            self._clients[name] = OpenAIClient(self.configs[name], self._session)
        return self._clients[name]

    def chain(self, names: Sequence[str]) -> Chain:
        """The providers ``names``, tried in that order."""
        if not names:
            raise ConfigError("providers", "a chain needs at least one provider")
        return Chain([self.client(name) for name in names], self.limits, self.ledger)

    async def close(self) -> None:
        if self.ledger is not None:
            await self.ledger.rows.drain()
        if self.limits.limiter.auto is not None:
            await self.limits.limiter.auto.drain()
        session, self._session = self._session, None
        self._clients.clear()
        if session is not None:
            await session.close()


SHARED_KEY = "providers"


def shared_providers(runtime: Any) -> ModelProviders:
    """The process's model providers, under ``runtime.shared["providers"]``: one HTTP session
    for every caller (the embedder, the chat handler), closed with the runtime."""
    found = runtime.shared.get(SHARED_KEY)
    if found is None:
        found = ModelProviders.from_settings(runtime.settings, runtime.durable, runtime.pg)
        runtime.shared[SHARED_KEY] = found
    assert isinstance(found, ModelProviders)
    return found
