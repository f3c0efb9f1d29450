"""Before a server takes its first request: redis-durable's connections are opened and the
Lua scripts its components bound are loaded (``gateway.stores.scripts``).

Without it the first writes of a fresh process each paid a ``NOSCRIPT`` round trip, a
``SCRIPT LOAD`` on a connection of their own (fifty concurrent first deliveries opened fifty)
and the retry; on Redis Cluster also the slot map and a connection to every primary. On a
loaded 2-core machine that took more than the inbound write budget (1.75 s, then 503). Done
at startup (aiohttp's ``on_startup``, before the socket listens) the first request pays none
of it. A store that does not answer here is only logged: the request path still loads a
script the server lacks (``AutoPipeline.run_script``), as after a restart or a failover.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster

from gateway.stores.cluster import load_scripts
from gateway.stores.redis import AnyRedis
from gateway.stores.scripts import bound_to

log = logging.getLogger("gateway.stores")
# A healthy store answers in milliseconds; a stalled one must not hold the start for long.
WARM_SECONDS = 3.0


async def warm(client: AnyRedis, seconds: float = WARM_SECONDS) -> bool:
    """Connect ``client`` and load every script bound to it so far; False (logged) when
    the store did not answer within ``seconds``."""
    scripts = bound_to(client)
    try:
        async with asyncio.timeout(seconds):
            if isinstance(client, RedisCluster):
                await client.initialize()
                await load_scripts(client, scripts)  # SCRIPT EXISTS/LOAD on every primary
                await client.ping(target_nodes=RedisCluster.PRIMARIES)
            else:
                await _load_in_one_round_trip(client, scripts)
    except Exception as exc:
        log.warning("redis-durable not warmed at start (%s: %s); the first requests load "
                    "its scripts", type(exc).__name__, exc)
        return False
    return True


async def _load_in_one_round_trip(client: Any, scripts: Sequence[Any]) -> None:
    async with client.pipeline(transaction=False) as pipe:
        for script in scripts:
            pipe.script_load(script.script)
        pipe.ping()  # a script-less client is connected too
        await pipe.execute()
