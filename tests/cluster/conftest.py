"""Every test in this directory runs on two local three-master Redis Clusters.

``servers`` is overridden here: on a ``GATEWAY_TEST_TOPOLOGY=cluster`` session it is the
session's own clusters, otherwise two clusters are started once for this directory, with the
session's PostgreSQL. ``settings``, ``runtime`` and ``client`` then work unchanged on them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster

from gateway.stores import embedded
from tests import topology
from tests.conftest import ServerSet
from tests.topology import LocalCluster


@pytest.fixture(scope="session")
def servers(servers: ServerSet, tmp_root: Path) -> Iterator[ServerSet]:
    if topology.is_cluster_run():
        yield servers
        return
    started: list[LocalCluster] = []
    try:
        for role in ("durable", "cache"):
            cluster = LocalCluster(role, tmp_root / f"cluster-{role}",
                                   embedded.new_password())
            started.append(cluster.start())
        durable, cache = started
        yield replace(servers, durable_url=durable.url, cache_url=cache.url, durable=None,
                      cache=None, extra=[*servers.extra, *started])
    finally:
        for cluster in started:
            with contextlib.suppress(Exception):
                cluster.stop()


def keys_on_every_primary(client: RedisCluster,
                          build: Callable[[int], str]) -> dict[str, str]:
    """One key per primary node (node name -> key), built by ``build(i)`` for i = 0, 1, ..."""
    wanted = {node.name for node in client.get_primaries()}
    found: dict[str, str] = {}
    for i in range(10_000):
        key = build(i)
        node: ClusterNode = client.get_node_from_key(key)
        found.setdefault(node.name, key)
        if set(found) == wanted:
            return found
    raise AssertionError(f"no key of this shape reaches every primary: {found}")


async def on_node(client: RedisCluster, node_name: str, *args: Any) -> Any:
    """A command sent to one named node, whatever its keys hash to."""
    node = client.get_node(node_name=node_name)
    assert node is not None, node_name
    return await client.execute_command(*args, target_nodes=node)
