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


async def test_migration_0017_gives_existing_documents_their_owners(servers: ServerSet) -> None:
    """Documents stored before owners existed get the owner their item id tells, the same
    one the store stage gives a new document (``keys.document_owner``)."""
    from gateway import keys

    url = await _fresh_database(servers, "migrate_owners")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE TABLE schema_migrations (version integer PRIMARY KEY,"
                           " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        for earlier in (m for m in migrate.available() if m.version < 17):
            await conn.execute(earlier.path.read_text())
            await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                               earlier.version, earlier.name)
        account = keys.owner_namespace("alice")
        expected = {
            "k.3f9a/payroll-03": "k.3f9a",  # an API key's job
            f"{account}/notes": account,  # an account's job
            "webhook:demo:msg_1": "src.demo",  # a webhook delivery
            "webhook:gh:a:b:c": "src.gh",  # a delivery id with colons
            "nightly-report": "ops",  # the admin token's bare job id
            "k.not-hex/x": "ops",  # not a key's namespace: nobody's but the operators'
            "u.short/x": "ops",
        }
        for item_id in expected:
            await conn.execute(
                "INSERT INTO pipeline_documents (item_id, priority, doc_type, body, document)"
                " VALUES ($1, 'normal', 'other', 'text', '{}')", item_id)
            await conn.execute("INSERT INTO pipeline_chunks (item_id, seq, body)"
                               " VALUES ($1, 0, 'text')", item_id)
        applied = await migrate.migrate(conn)
        assert 17 in [m.version for m in applied]
        for table in ("pipeline_documents", "pipeline_chunks"):
            owners = dict(await conn.fetch(f"SELECT item_id, owner FROM {table}"))
            assert owners == expected, table
        assert {item: keys.document_owner(item) for item in expected} == expected
    finally:
        await conn.close()
