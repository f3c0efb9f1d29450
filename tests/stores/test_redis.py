"""The shared Redis clients survive a dropped connection: the retry really retries."""

from __future__ import annotations

import asyncio

import pytest

from gateway import keys
from gateway.config import ConfigError
from gateway.stores import redis as redis_clients
from tests.conftest import ServerSet
from tests.helpers import wait_until


@pytest.mark.single_instance  # CLIENT KILL reaches one node; the cluster client retries alike
async def test_a_command_whose_connection_is_killed_is_retried(servers: ServerSet) -> None:
    """A connection dropped *during* a command (not idle in the pool, where the pool's own
    check would catch it) must be retried, not surface as a ConnectionError."""
    key = keys.q("test", "retry")
    client = redis_clients.connect(servers.durable_url, variable="GATEWAY_DURABLE_URL")
    killer = redis_clients.connect(servers.durable_url, variable="GATEWAY_DURABLE_URL")
    try:
        waiting = asyncio.create_task(client.blpop([key], timeout=10))

        async def blocked() -> bool:
            return any(c.get("cmd") == "blpop" for c in await killer.client_list())

        await wait_until(blocked, timeout=10, message="BLPOP to block")
        assert await killer.client_kill_filter(_type="normal", skipme=True) >= 1
        await wait_until(blocked, timeout=10, message="BLPOP to be retried")
        await killer.rpush(key, "item")
        assert await asyncio.wait_for(waiting, 10) == (key, "item")
    finally:
        await killer.delete(key)
        await client.aclose()
        await killer.aclose()


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "redis+unknown://127.0.0.1:6379"])
def test_unsupported_scheme_names_the_variable(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        redis_clients.connect(url, variable="GATEWAY_CACHE_URL")
    assert "GATEWAY_CACHE_URL" in str(caught.value)


def test_cluster_urls_are_recognised() -> None:
    assert redis_clients.is_cluster_url("redis+cluster://:pw@10.0.0.1:7000/")
    assert redis_clients.is_cluster_url("rediss+cluster://10.0.0.1:7000/")
    assert not redis_clients.is_cluster_url("redis://10.0.0.1:6379/0")
    assert not redis_clients.is_cluster_url("redis+sentinel://10.0.0.1:26379/gw")
