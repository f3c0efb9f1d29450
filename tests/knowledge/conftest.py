"""A second database on the same server, migrated with ``gateway.pgvector = off``: the
scan layout (float8[] vectors, no index), for comparing it with pgvector's HNSW."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from gateway.config import Settings
from gateway.stores.migrate import migrate_url
from gateway.stores.runtime import Runtime, open_runtime

SCAN_DB = "gateway_scan"


async def _create(admin_url: str, url: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {SCAN_DB}")
        await conn.execute(f"CREATE DATABASE {SCAN_DB}")
        await conn.execute(f"ALTER DATABASE {SCAN_DB} SET gateway.pgvector = 'off'")
    finally:
        await conn.close()
    await migrate_url(url)


@pytest.fixture(scope="session")
def scan_database_url(servers) -> Iterator[str]:  # type: ignore[no-untyped-def]
    url = urlunsplit(urlsplit(servers.database_url)._replace(path=f"/{SCAN_DB}"))
    asyncio.run(_create(servers.database_url, url))
    yield url


@pytest.fixture
async def scan_runtime(scan_database_url: str, settings: Settings,
                       runtime: Runtime) -> AsyncIterator[Runtime]:
    """A runtime on the scan database, sharing the test's Redis (emptied by ``runtime``)."""
    rt = await open_runtime(dataclasses.replace(settings, database_url=scan_database_url))
    await rt.pg.execute("TRUNCATE pipeline_chunks, pipeline_documents, pipeline_journal")
    try:
        yield rt
    finally:
        await rt.close()
