"""Embedded stores for a benchmark: redis-durable, redis-cache and PostgreSQL (migrated) in
``root``, a ``Runtime`` on them, all stopped on exit. Import as a sibling script
(``from stores import embedded_runtime``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.config import Settings
from gateway.stores import embedded
from gateway.stores.migrate import migrate_url
from gateway.stores.runtime import Runtime, open_runtime


@contextlib.asynccontextmanager
async def embedded_runtime(root: Path, sections: Mapping[str, Any] | None = None,
                           pg_max_size: int = 10) -> AsyncIterator[Runtime]:
    servers: list[embedded.RedisServer | embedded.PostgresServer] = []
    try:
        durable = embedded.RedisServer("durable", root / "durable", embedded.new_password())
        cache = embedded.RedisServer("cache", root / "cache", embedded.new_password())
        pg = embedded.PostgresServer(root / "pg")
        for server in (durable, cache, pg):
            servers.append(server.start())
        await migrate_url(pg.url)
        settings = dataclasses.replace(
            Settings(durable_url=durable.url, cache_url=cache.url, database_url=pg.url),
            sections=dict(sections or {}))
        rt = await open_runtime(settings, pg_max_size=pg_max_size)
        try:
            yield rt
        finally:
            await rt.close()
    finally:
        embedded.stop_all(servers)


def run_in_tempdir(main: Callable[[Any, Path], Awaitable[None]], args: Any) -> None:
    """``asyncio.run(main(args, root))`` with ``root`` a temporary directory for the stores."""
    with tempfile.TemporaryDirectory(prefix="gwb-") as root:
        asyncio.run(main(args, Path(root)))
