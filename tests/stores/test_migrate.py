import asyncio

import asyncpg

from gateway.stores import migrate
from tests.conftest import ServerSet


async def _fresh_database(servers: ServerSet, name: str) -> str:
    conn = await asyncpg.connect(servers.database_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base, _, _ = servers.database_url.rpartition("/")
    return f"{base}/{name}"


async def test_migrate_is_idempotent_and_recorded(servers: ServerSet) -> None:
    url = await _fresh_database(servers, "migrate_once")
    first = await migrate.migrate_url(url)
    assert [m.version for m in first] == [m.version for m in migrate.available()]
    assert await migrate.migrate_url(url) == []
    conn = await asyncpg.connect(url)
    try:
        versions = [r["version"] for r in await conn.fetch(
            "SELECT version FROM schema_migrations ORDER BY version")]
        assert versions == [m.version for m in migrate.available()]
        assert await migrate.pending(conn) == []
    finally:
        await conn.close()


async def test_concurrent_migrations_take_turns(servers: ServerSet) -> None:
    url = await _fresh_database(servers, "migrate_race")
    results = await asyncio.gather(*(migrate.migrate_url(url) for _ in range(4)))
    applied = [m.version for result in results for m in result]
    assert sorted(applied) == [m.version for m in migrate.available()]
