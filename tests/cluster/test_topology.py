"""The local clusters themselves, and the fixtures' promises on them: every primary is
flushed between tests, scripts are flushed everywhere, the registry scan sees every node."""

from __future__ import annotations

from redis.asyncio.cluster import RedisCluster

from gateway import keys
from gateway.stores.runtime import Runtime
from tests.cluster.conftest import keys_on_every_primary, on_node
from tests.conftest import ServerSet, reset_stores
from tests.helpers import registry_violations


async def cluster(client: object) -> RedisCluster:
    """The runtime's client as a cluster client, with its slot map loaded."""
    assert isinstance(client, RedisCluster), type(client)
    await client.initialize()
    return client


async def test_both_roles_are_three_master_clusters_with_every_slot(runtime: Runtime) -> None:
    for client in (await cluster(runtime.durable), await cluster(runtime.cache)):
        assert len(client.get_primaries()) == 3
        for node in client.get_primaries():
            info = await on_node(client, node.name, "CLUSTER", "INFO")
            text = info if isinstance(info, str) else str(info)
            assert "cluster_state:ok" in text and "cluster_slots_assigned:16384" in text


async def test_roles_keep_their_policies_on_every_node(runtime: Runtime) -> None:
    durable = await runtime.durable.config_get("maxmemory-policy",
                                               target_nodes=RedisCluster.ALL_NODES)
    cache = await runtime.cache.config_get("maxmemory-policy",
                                           target_nodes=RedisCluster.ALL_NODES)
    assert {v["maxmemory-policy"] for v in durable.values()} == {"noeviction"}
    assert {v["maxmemory-policy"] for v in cache.values()} == {"allkeys-lru"}


async def test_reset_flushes_keys_and_scripts_on_every_primary(
        runtime: Runtime, servers: ServerSet) -> None:
    client = await cluster(runtime.durable)
    placed = keys_on_every_primary(client, lambda i: keys.dedup_job(f"job-{i}"))
    for key in placed.values():
        await client.set(key, "x", ex=60)
    sha = await client.script_load("return 1")
    for node in placed:
        assert await on_node(client, node, "DBSIZE") >= 1
        assert await on_node(client, node, "SCRIPT", "EXISTS", sha) == [True]

    await reset_stores(servers)

    for node in placed:
        assert await on_node(client, node, "DBSIZE") == 0
        assert await on_node(client, node, "SCRIPT", "EXISTS", sha) == [False]


async def test_registry_scan_reaches_every_node(runtime: Runtime) -> None:
    client = await cluster(runtime.cache)
    stray = keys_on_every_primary(client, lambda i: f"stray:{i}")
    for key in stray.values():
        await client.set(key, "x")
    good = keys.cache("search", "q")
    await client.set(good, "x", ex=60)
    problems = await registry_violations(client, "cache")
    assert sorted(problems) == sorted(f"{key}: no registry row" for key in stray.values())


async def test_pipeline_keys_share_one_slot(runtime: Runtime) -> None:
    client = await cluster(runtime.durable)
    built = [keys.q(kind, stage) for kind in ("ready", "lease", "delayed", "dead")
             for stage in ("store", "chunk", "embed", "graph")]
    assert len({client.keyslot(key) for key in built}) == 1
