"""Embedded stores for a benchmark: redis-durable, redis-cache and PostgreSQL (migrated) in
``root``, a ``Runtime`` on them, all stopped on exit. Import as a sibling script
(``from stores import embedded_runtime``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
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


def stores_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's descendants by kind ("postgresql", "redis"), from
    /proc (Linux; empty elsewhere): the embedded servers are children of the bench and
    PostgreSQL's backends their children, so a figure per message can include the stores."""
    parents: dict[int, int] = {}
    seconds: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = entry.read_text()
        except OSError:
            continue  # exited meanwhile
        name, fields = text[text.index("(") + 1:text.rindex(")")], text.rsplit(")", 1)[1].split()
        pid = int(entry.parent.name)
        parents[pid] = int(fields[1])
        seconds[pid] = (name, (int(fields[11]) + int(fields[12])) / tick)
    kinds: dict[str, float] = {}
    for pid, (name, cpu) in seconds.items():
        ancestor = parents.get(pid)
        while ancestor and ancestor != os.getpid():
            ancestor = parents.get(ancestor)
        if ancestor:
            kind = ("postgresql" if name.startswith("postgres") else
                    "redis" if "redis" in name or "valkey" in name else name)
            kinds[kind] = kinds.get(kind, 0.0) + cpu
    return kinds
