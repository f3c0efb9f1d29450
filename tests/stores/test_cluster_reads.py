"""On Redis Cluster the client of client reads is bounded too: READ_REDIS_CONNECTIONS per
node (redis-py keeps a pool per node). Its pools cannot wait for a connection to come free,
so a read past the limit is refused at once (503 + Retry-After) while deliveries, on the
process's own client, go on."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import MaxConnectionsError

from gateway.api.errors import store_error
from gateway.pipeline.stages import meta_key
from gateway.stores import embedded
from gateway.stores import redis as redis_clients
from gateway.stores.runtime import READ_REDIS_CONNECTIONS, Runtime, open_runtime
from gateway.web.app import create_app
from tests import topology
from tests.conftest import ServerSet
from tests.inbound.webhook_helpers import body_of, post_as_sender, standard

SLACK = 1.5


@pytest.fixture(scope="module")
def cluster_url(servers: ServerSet, tmp_root: Path) -> Iterator[str]:
    """The session's durable cluster on a cluster run, else one of this module's own."""
    if topology.is_cluster_run():
        yield servers.durable_url
        return
    cluster = topology.LocalCluster("durable", tmp_root / "cluster-reads",
                                    embedded.new_password()).start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


async def test_the_limit_is_per_node_and_refuses_at_once(cluster_url: str) -> None:
    client = redis_clients.connect(cluster_url, variable="test", max_connections=2,
                                   wait_for_connection=2.0)
    default = redis_clients.connect(cluster_url, variable="test")
    assert isinstance(client, RedisCluster) and isinstance(default, RedisCluster)
    try:
        await client.initialize()
        await default.initialize()
        assert {node.max_connections for node in client.get_nodes()} == {2}
        assert min(node.max_connections for node in default.get_nodes()) > 2
        key = meta_key()
        node = client.get_node_from_key(key)
        held = [node.acquire_connection() for _ in range(2)]
        try:
            started = time.monotonic()
            with pytest.raises(MaxConnectionsError) as refused:
                await client.hget(key, "x")
            assert time.monotonic() - started < SLACK
            mapped = store_error(refused.value)
            assert mapped is not None and mapped.status == 503
            assert mapped.headers["Retry-After"]
        finally:
            for connection in held:
                node.release(connection)
        assert await client.hget(key, "x") is None
    finally:
        await client.aclose()
        await default.aclose()


async def test_exhausted_cluster_reads_leave_deliveries_alone(
        cluster_url: str, runtime: Runtime, make_client: Callable[..., Any]) -> None:
    rt = await open_runtime(dataclasses.replace(runtime.settings, durable_url=cluster_url))
    try:
        reads, durable = rt.read_durable, rt.durable
        assert isinstance(reads, RedisCluster) and isinstance(durable, RedisCluster)
        await reads.initialize()
        assert {node.max_connections for node in reads.get_nodes()} == {
            READ_REDIS_CONNECTIONS}
        client = await make_client(create_app(rt), rt=rt)
        node = reads.get_node_from_key(meta_key())
        held = [node.acquire_connection() for _ in range(READ_REDIS_CONNECTIONS)]
        try:
            body = body_of({"text": "busy"})
            # Were the held reads in its way, every try would be refused.
            delivered = await post_as_sender(client, "/v1/webhooks/demo", body,
                                             standard(body, "busy"))
            assert delivered.status == 202
            started = time.monotonic()
            async with client.get("/v1/jobs/webhook:demo:busy") as read:
                assert read.status == 503 and read.headers["Retry-After"]
                assert (await read.json())["error"] == "store_unavailable"
            assert time.monotonic() - started < SLACK  # refused, not queued
        finally:
            for connection in held:
                node.release(connection)
        async with client.get("/v1/jobs/webhook:demo:busy") as read:
            assert read.status == 200
    finally:
        await rt.close()
