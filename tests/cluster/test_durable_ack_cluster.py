"""``GATEWAY_DURABLE_ACK=aof`` on Redis Cluster: WAITAOF covers only the writes of the
connection it is sent on, and a cluster pipeline spreads a flush over each node's pooled
connections; so each primary gets a ``sync:`` barrier write and the WAITAOF on one connection,
after the flush's writes, and the barrier's fsync is theirs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio.cluster import RedisCluster

from gateway import keys
from gateway.stores import embedded
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.redis import connect
from tests.cluster.conftest import keys_on_every_primary, on_node
from tests.topology import LocalCluster


@pytest.fixture(scope="module")
def valkey_cluster(tmp_root: Path) -> Iterator[LocalCluster]:
    """Valkey nodes: the machine's redis-server may predate WAITAOF (7.2)."""
    cluster = LocalCluster("durable", tmp_root / "cluster-aof", embedded.new_password(),
                           binary=embedded.find_valkey_server()).start()
    try:
        yield cluster
    finally:
        cluster.stop()


async def test_every_primary_waits_on_its_own_barrier_write(
        valkey_cluster: LocalCluster) -> None:
    client = connect(valkey_cluster.url, variable="test")
    assert isinstance(client, RedisCluster)
    try:
        await client.initialize()
        auto = AutoPipeline(client, wait_aof=True)
        per_node = keys_on_every_primary(client, lambda i: keys.rl("aof", i))
        # Several connections per node in the pool, so the pipeline's connection and the
        # one a plain command would take next are not the same one.
        await asyncio.gather(*(client.get(key) for key in per_node.values() for _ in range(8)))
        await asyncio.gather(*(auto.execute("SET", key, "1") for key in per_node.values()))
        for name, key in per_node.items():
            stats = await on_node(client, name, "INFO", "commandstats")
            assert stats["cmdstat_waitaof"]["calls"] == auto.flushes
            barrier = auto._barrier_keys[name]
            assert keys.row_for(barrier) is not None
            assert client.get_node_from_key(barrier).name == name
            assert await client.pttl(barrier) > 0  # written on that node, and expiring
            assert await client.get(key) == "1"
    finally:
        await client.aclose()
