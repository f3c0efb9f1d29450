"""The open connections to the three stores, shared by every component of one process."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from redis.asyncio.cluster import RedisCluster

from gateway.config import ConfigError, Settings
from gateway.stores import redis as redis_clients
from gateway.stores import shards as pipeline_shards
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.postgres import create_pool
from gateway.stores.redis import AnyRedis

CLOSE_SECONDS = 10.0


# Client reads (job status, feed pages, search, admin and dashboard reads, API-key checks)
# have pools of their own, so a flood of them queues there and never takes the connections
# inbound writes, the pipeline and the conversations need. A read waits at most
# READ_WAIT_SECONDS for a connection (on PostgreSQL opening one included), then 503 +
# Retry-After.
READ_REDIS_CONNECTIONS = 16
READ_PG_CONNECTIONS = 4
READ_WAIT_SECONDS = 2.0
# A client read's statement is cancelled after this (503 + Retry-After): a stalled or locked
# database gives the reader a fast answer; the record's own writers keep the 30 s budget.
READ_STATEMENT_SECONDS = 5.0
# The longest a client read can take on a stalled PostgreSQL: the wait for a connection, one
# statement, and the connection's release (asyncpg gives it the wait's budget: a statement
# that timed out waits that long for its cancellation, then the connection is dropped).
# Most reads are refused sooner: once the read pool's connections are stuck, a new read
# fails its wait for one (READ_WAIT_SECONDS).
READ_PG_BUDGET_SECONDS = READ_WAIT_SECONDS + READ_STATEMENT_SECONDS + READ_WAIT_SECONDS


@dataclass
class Runtime:
    settings: Settings
    durable: AnyRedis
    cache: AnyRedis
    pg: asyncpg.Pool
    read_durable: AnyRedis | None = None
    read_pg: asyncpg.Pool | None = None

    @property
    def durable_reads(self) -> AnyRedis:
        """redis-durable for what clients read (its own pool when there is one)."""
        return self.read_durable or self.durable

    @property
    def pg_reads(self) -> asyncpg.Pool:
        """PostgreSQL for what clients read (its own pool when there is one)."""
        return self.read_pg or self.pg
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
        for pool in (self.pg, self.read_pg):
            if pool is None:
                continue
            try:
                async with asyncio.timeout(CLOSE_SECONDS):
                    await pool.close()
            except Exception:  # timed out or failed: drop the connections without waiting
                pool.terminate()
        for client in (self.durable, self.cache, self.read_durable):
            if client is None:
                continue
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
    """Connect to all three stores. Redis clients connect lazily; the pools connect now."""
    durable_url, _, database_url = require_urls(settings)
    durable, cache = connect_redis(settings)
    read_durable = redis_clients.connect(
        durable_url, variable="GATEWAY_DURABLE_URL", max_connections=READ_REDIS_CONNECTIONS,
        wait_for_connection=READ_WAIT_SECONDS)
    pools: list[asyncpg.Pool] = []
    try:
        pools.append(await create_pool(database_url, max_size=pg_max_size))
        pools.append(await create_pool(database_url, max_size=READ_PG_CONNECTIONS,
                                       command_timeout=READ_STATEMENT_SECONDS,
                                       acquire_seconds=READ_WAIT_SECONDS))
    except BaseException:
        for pool in pools:
            pool.terminate()
        for client in (durable, cache, read_durable):
            await client.aclose()
        raise
    for client in (durable, read_durable):
        pipeline_shards.configure(client, settings.pipeline_shards)
    return Runtime(settings, durable, cache, pools[0], read_durable, pools[1])


def durable_pipeline(runtime: Runtime) -> AutoPipeline:
    """A command coalescer on redis-durable for acknowledged writes: with
    ``GATEWAY_DURABLE_ACK=aof`` each of its batches waits until it is on the server's disk."""
    return AutoPipeline(runtime.durable, wait_aof=runtime.settings.durable_ack == "aof")


_CHAT_PIPELINE = "_chat_durable_pipeline"


def chat_pipeline(runtime: Runtime) -> AutoPipeline:
    """The runtime's one coalescer on redis-durable for the chat path (every platform's
    inbox: push, fence, sent mark, ack; and the platform limits of the replies), so the
    commands of concurrent chats share round trips whatever part of a message each is at.
    Acknowledged writes go through it: with ``GATEWAY_DURABLE_ACK=aof`` it waits for the
    disk like ``durable_pipeline``.

    On Redis Cluster each caller keeps a coalescer of its own, as before the sharing: with
    one shared by the inbox and the reply limits, chat copies waited past the inbound write
    budget (503) in the cluster test pass, and the sharing's gain was measured on one
    instance only."""
    if isinstance(runtime.durable, RedisCluster):
        return durable_pipeline(runtime)
    auto = getattr(runtime, _CHAT_PIPELINE, None)
    if auto is None:
        auto = durable_pipeline(runtime)
        setattr(runtime, _CHAT_PIPELINE, auto)
    return auto
