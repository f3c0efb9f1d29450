"""The open connections to the three stores, shared by every component of one process."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from gateway.config import ConfigError, Settings
from gateway.stores import redis as redis_clients
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.postgres import create_pool
from gateway.stores.redis import AnyRedis

CLOSE_SECONDS = 10.0


@dataclass
class Runtime:
    settings: Settings
    durable: AnyRedis
    cache: AnyRedis
    pg: asyncpg.Pool
    # Per-process clients built on these stores by the rooms above (e.g. "providers", the
    # model providers): made once, shared by every component, closed (``await x.close()``)
    # before the stores.
    shared: dict[str, Any] = field(default_factory=dict)

    async def close(self) -> None:
        """Close the shared clients, then the stores, bounded: asyncpg's graceful close waits
        for every connection to be released, so a connection a cancelled task still holds
        would keep it forever."""
        shared, self.shared = list(self.shared.values()), {}
        for client in shared:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_SECONDS):
                    await client.close()
        try:
            async with asyncio.timeout(CLOSE_SECONDS):
                await self.pg.close()
        except Exception:  # timed out or failed: drop the connections without waiting
            self.pg.terminate()
        for client in (self.durable, self.cache):
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_SECONDS):
                    await client.aclose()


def require_urls(settings: Settings) -> tuple[str, str, str]:
    missing = [name for name, value in (
        ("GATEWAY_DURABLE_URL", settings.durable_url),
        ("GATEWAY_CACHE_URL", settings.cache_url),
        ("GATEWAY_DATABASE_URL", settings.database_url),
    ) if not value]
    if missing:
        raise ConfigError(missing[0], "is required (or run `gateway dev` for embedded servers)")
    assert settings.durable_url and settings.cache_url and settings.database_url
    return settings.durable_url, settings.cache_url, settings.database_url


def connect_redis(settings: Settings) -> tuple[AnyRedis, AnyRedis]:
    durable_url, cache_url, _ = require_urls(settings)
    return (redis_clients.connect(durable_url, variable="GATEWAY_DURABLE_URL"),
            redis_clients.connect(cache_url, variable="GATEWAY_CACHE_URL"))


async def open_runtime(settings: Settings, *, pg_max_size: int = 10) -> Runtime:
    """Connect to all three stores. Redis clients connect lazily; the pool connects now."""
    _, _, database_url = require_urls(settings)
    durable, cache = connect_redis(settings)
    try:
        pg = await create_pool(database_url, max_size=pg_max_size)
    except BaseException:
        await durable.aclose()
        await cache.aclose()
        raise
    return Runtime(settings, durable, cache, pg)


def durable_pipeline(runtime: Runtime) -> AutoPipeline:
    """A command coalescer on redis-durable for acknowledged writes: with
    ``GATEWAY_DURABLE_ACK=aof`` each of its batches waits until it is on the server's disk."""
    return AutoPipeline(runtime.durable, wait_aof=runtime.settings.durable_ack == "aof")
