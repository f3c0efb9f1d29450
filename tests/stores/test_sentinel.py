"""``redis+sentinel://`` URLs against a real sentinel watching a master and its replica."""

from __future__ import annotations

import re
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.config import ConfigError, Settings
from gateway.dedup import claims
from gateway.keys import dedup_webhook
from gateway.stores import doctor, embedded
from gateway.stores import redis as redis_clients
from gateway.stores.sentinel import parse
from tests.helpers import wait_until
from tests.topology import SentinelSet, command

pytestmark = pytest.mark.single_instance  # a sentinel set of its own, whatever the session's


def _start(**options: bool) -> SentinelSet:
    root = Path(tempfile.mkdtemp(prefix="gws-"))
    return SentinelSet(root, embedded.new_password(), **options).start()


@pytest.fixture(scope="module")
def sentinel_set() -> Iterator[SentinelSet]:
    started = _start()
    yield started
    started.stop()


@pytest.fixture
async def client(sentinel_set: SentinelSet) -> AsyncIterator[redis_clients.AnyRedis]:
    connected = redis_clients.connect(sentinel_set.url, variable="GATEWAY_DURABLE_URL")
    yield connected
    await connected.aclose()


async def test_set_get_through_sentinel_reaches_the_master_and_replicates(
        sentinel_set: SentinelSet, client: redis_clients.AnyRedis) -> None:
    assert sentinel_set.master and sentinel_set.replica
    await client.set("dedup:webhook:demo:s1", "v1", ex=60)
    assert await client.get("dedup:webhook:demo:s1") == "v1"
    info = await client.info("server")
    assert int(info["tcp_port"]) == sentinel_set.master_port()
    assert await client.wait(1, 5000) == 1  # the replica acknowledged the write
    on_replica = command(sentinel_set.replica.port, sentinel_set.password,
                         "GET", "dedup:webhook:demo:s1")
    assert on_replica == "v1"


async def test_dedup_claims_through_sentinel(client: redis_clients.AnyRedis) -> None:
    key = dedup_webhook("demo", "sentinel-1")
    first = await claims.claim(client, key, 60)
    assert first.claimed and not (await claims.claim(client, key, 60)).claimed
    assert await claims.release(client, first)
    assert (await claims.claim(client, key, 60)).claimed


@pytest.mark.slow
async def test_client_follows_a_failover(sentinel_set: SentinelSet,
                                         client: redis_clients.AnyRedis) -> None:
    assert sentinel_set.master and sentinel_set.replica
    old, new = sentinel_set.master.port, sentinel_set.replica.port
    await client.set("before", "1")
    assert await client.wait(1, 5000) == 1
    assert sentinel_set.master_port() == old

    sentinel_set.sentinel("FAILOVER", sentinel_set.service)
    await wait_until(lambda: sentinel_set.master_port() == new, timeout=20,
                     message="sentinel to promote the replica")

    # Sentinel promotes first and demotes the old master after: wait for both (a write in
    # between lands on the old master and is lost; see docs/architecture.md).
    for port, role in ((new, "master"), (old, "slave")):
        await wait_until(lambda p=port, r=role: command(p, sentinel_set.password, "INFO",
                                                        "replication")["role"] == r,
                         timeout=20, message=f"{port} to become {role}")
    # The pooled connection still points at the demoted master: it answers READONLY, the
    # client drops it, asks the sentinel again and the write lands on the new master with
    # no error reaching the caller.
    await client.set("after", "2")
    assert command(new, sentinel_set.password, "GET", "after") == "2"
    assert await client.get("before") == "1"
    info = await client.info("server")
    assert int(info["tcp_port"]) == new


async def test_sentinels_without_password() -> None:
    open_sentinel = _start(sentinel_auth=False)
    try:
        assert open_sentinel.url.endswith("?sentinel_password=")
        connected = redis_clients.connect(open_sentinel.url, variable="GATEWAY_DURABLE_URL")
        try:
            await connected.set("k", "v")
            assert await connected.get("k") == "v"
        finally:
            await connected.aclose()
    finally:
        open_sentinel.stop()


@pytest.mark.parametrize("url", [
    "redis+sentinel://127.0.0.1:26379",
    "redis+sentinel://127.0.0.1:26379/",
    "redis+sentinel://127.0.0.1/mymaster",
    "redis+sentinel://127.0.0.1:26379/mymaster/x",
    "redis+sentinel://127.0.0.1:26379/mymaster?cluster=1",
])
def test_malformed_urls_name_the_variable(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(url, variable="GATEWAY_CACHE_URL")
    assert "GATEWAY_CACHE_URL" in str(caught.value)


def test_url_parts() -> None:
    spec = parse("rediss+sentinel://app:p%40ss@s1:26379,[::1]:26380/cache/2",
                 variable="GATEWAY_CACHE_URL")
    assert spec.nodes == (("s1", 26379), ("::1", 26380))
    assert (spec.service, spec.db, spec.username, spec.password) == ("cache", 2, "app", "p@ss")
    assert spec.sentinel_password == "p@ss" and spec.tls
    other = parse("redis+sentinel://:pw@s1:26379/durable?sentinel_password=sp",
                  variable="GATEWAY_DURABLE_URL")
    assert other.sentinel_password == "sp" and other.password == "pw" and not other.tls


def test_readme_examples_parse() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    urls = re.findall(r"'(rediss?\+(?:sentinel|cluster)://[^']+)'", readme)
    assert len([u for u in urls if "+sentinel" in u]) >= 2, urls
    for url in urls:
        if "+sentinel" in url:
            spec = parse(url, variable="GATEWAY_DURABLE_URL")
            assert spec.nodes and spec.service.startswith("gateway-") and spec.password
        else:
            assert redis_clients.is_cluster_url(url)


async def test_doctor_checks_the_master_behind_the_sentinel(sentinel_set: SentinelSet,
                                                            settings: Settings) -> None:
    checks = await doctor.run_checks(replace(settings, durable_url=sentinel_set.url))
    durable = [(c.status, c.message) for c in checks if c.subject == "redis-durable"]
    assert ("ok", "maxmemory-policy noeviction") in durable
    assert all(status == "ok" for status, _ in durable), durable
    assert not doctor.has_failure(checks), [c.line() for c in checks]
