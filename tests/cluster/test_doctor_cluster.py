"""``gateway doctor`` and readiness on cluster URLs: every node is asked, not just one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from gateway.config import Settings
from gateway.stores import doctor
from gateway.stores import redis as redis_clients
from tests.conftest import ServerSet


@pytest.fixture
async def durable_nodes(settings: Settings) -> AsyncIterator[RedisCluster]:
    assert settings.durable_url
    client = redis_clients.connect(settings.durable_url, variable="test")
    assert isinstance(client, RedisCluster)
    await client.initialize()
    yield client
    await client.aclose()


def lines(checks: list[doctor.Check], subject: str) -> list[tuple[str, str]]:
    return [(c.status, c.message) for c in checks if c.subject == subject]


async def test_doctor_passes_on_two_clusters(settings: Settings) -> None:
    checks = await doctor.run_checks(settings)
    assert not doctor.has_failure(checks), [c.line() for c in checks]
    assert ("ok", "maxmemory-policy noeviction") in lines(checks, "redis-durable")
    assert ("ok", "maxmemory-policy allkeys-lru") in lines(checks, "redis-cache")
    assert any(c.subject == "topology" and c.status == "ok" for c in checks)


async def test_one_evicting_node_fails_the_durable_cluster(
        settings: Settings, durable_nodes: RedisCluster) -> None:
    odd = durable_nodes.get_primaries()[-1]
    await durable_nodes.config_set("maxmemory-policy", "allkeys-lru", target_nodes=odd)
    try:
        checks = await doctor.run_checks(settings)
    finally:
        await durable_nodes.config_set("maxmemory-policy", "noeviction", target_nodes=odd)
    assert ("fail", "maxmemory-policy is mixed (allkeys-lru, noeviction): it can evict queued "
            "items, dedup claims and leases; set noeviction") in lines(checks, "redis-durable")


async def test_same_cluster_for_both_roles_fails(settings: Settings) -> None:
    checks = await doctor.run_checks(replace(settings, cache_url=settings.durable_url))
    assert any(c.subject == "topology" and c.status == "fail" for c in checks)


def test_doctor_command_on_cluster_urls(servers: ServerSet) -> None:
    env = {**os.environ, "GATEWAY_DURABLE_URL": servers.durable_url,
           "GATEWAY_CACHE_URL": servers.cache_url, "GATEWAY_DATABASE_URL": servers.database_url}
    env.pop("GATEWAY_CONFIG", None)
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "doctor"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout.splitlines()
    assert out and all(line.split()[0] == "ok" for line in out), out
    assert servers.durable_url.split("@")[0].split(":")[-1] not in result.stdout  # password


async def test_readiness_on_clusters(client: Any) -> None:
    response = await client.get("/readyz")
    body = await response.json()
    assert response.status == 200, body
    assert body["checks"]["redis-durable"]["ok"] and body["checks"]["redis-cache"]["ok"]
