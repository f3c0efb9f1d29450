"""Clients for the two Redis instances, from ``redis://``, ``rediss://``, ``unix://``,
``redis+cluster://`` / ``rediss+cluster://`` and ``redis+sentinel://`` / ``rediss+sentinel://``
URLs (user, password and TLS taken from the URL; sentinel details in sentinel.py).

One client per instance per process, shared by everything: redis-py's pool multiplexes the
concurrent callers. RESP2 is used on purpose: redis-py 8 spends measurably more CPU per
command on RESP3 (measured on redis-py 8) and the gateway needs nothing RESP3 gives.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.config import ConfigError
from gateway.stores.cluster import GatewayCluster
from gateway.stores.sentinel import connect_sentinel

AnyRedis: TypeAlias = "aioredis.Redis | RedisCluster"

# The budget of one Redis call: a stalled or unreachable server gives a timeout (503 +
# Retry-After on a request), never a hang. Every command the gateway sends is short (scripts
# work in bounded batches; WAITAOF waits at most 2 s), so this is far above a healthy reply.
REDIS_TIMEOUT_SECONDS = 3.0

# What a Redis call raises when the server cannot be reached or does not answer within the
# budget (builtin TimeoutError: a coalesced flush's own deadline).
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, TimeoutError)

# Connections per client on a single instance or Sentinel unless the caller says otherwise.
DEFAULT_CONNECTIONS = 64

_COMMON: dict[str, Any] = {
    "decode_responses": True,
    "protocol": 2,
    "socket_connect_timeout": REDIS_TIMEOUT_SECONDS,
    "socket_timeout": REDIS_TIMEOUT_SECONDS,
    "health_check_interval": 30,
}


def _retry() -> Retry:
    # Only connection errors are retried: a timed-out script may already have run, and every
    # script is fenced or idempotent, but blind retries of a timeout would hide overload.
    # The asyncio Retry, not redis.retry.Retry: the synchronous one returns the coroutine
    # unawaited from inside its loop, so an async client given it never retries at all.
    return Retry(ExponentialBackoff(cap=0.5, base=0.02), retries=3,
                 supported_errors=(RedisConnectionError,))


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0].endswith("+cluster")


def connect(url: str, *, variable: str, max_connections: int | None = None,
            wait_for_connection: float | None = None) -> AnyRedis:
    """A lazily-connecting client; nothing is contacted until the first command.

    ``max_connections`` bounds the client's connections: on a single instance or Sentinel
    its one pool (default 64), on a cluster the pool of each node (default redis-py's, 100).
    Past it a command fails at once with ``MaxConnectionsError`` (a ``ConnectionError``:
    503 + Retry-After on a request), except that with ``wait_for_connection`` a single
    instance's command first waits that long for a connection to come free (then
    ``ConnectionError``): for the pool of client reads, where a burst should queue, not
    fail. redis-py's cluster and Sentinel pools cannot wait, so there a read past the limit
    is refused at once."""
    scheme = url.split("://", 1)[0]
    if scheme.endswith("+sentinel"):
        return connect_sentinel(url, variable=variable, retry=_retry(),
                                retry_on_error=[RedisConnectionError],
                                max_connections=max_connections or DEFAULT_CONNECTIONS,
                                **_COMMON)
    if is_cluster_url(url):
        plain = url.replace("+cluster", "", 1)
        per_node = {} if max_connections is None else {"max_connections": max_connections}
        return GatewayCluster.from_url(plain, retry=_retry(), **per_node, **_COMMON)
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(variable, f"unsupported Redis URL scheme {scheme!r}")
    if wait_for_connection is not None:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections or DEFAULT_CONNECTIONS,
            timeout=wait_for_connection, retry=_retry(), retry_on_error=[RedisConnectionError],
            **_COMMON)
        return aioredis.Redis(connection_pool=pool)
    return aioredis.from_url(
        url, retry=_retry(), retry_on_error=[RedisConnectionError],
        max_connections=max_connections or DEFAULT_CONNECTIONS, **_COMMON,
    )
