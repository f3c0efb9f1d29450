"""``gateway dev``'s PostgreSQL has a password (issue 24 point 8), like its Redis: a local
user reaching the loopback port without it is refused, the superuser included, and the unix
socket admits only the server's owner. The URL ``gateway dev`` hands the gateway carries it;
a data directory made before passwords (trust) gets one on its next start."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import asyncpg
import pytest

from gateway.app.dev import start_stack
from gateway.config import Settings
from gateway.stores import embedded
from tests.conftest import ServerSet


async def _connects(url: str) -> bool:
    try:
        conn = await asyncpg.connect(url, timeout=10)
    except (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError):
        return False
    await conn.close()
    return True


async def test_gateway_devs_postgres_refuses_a_login_without_its_password(
        servers: ServerSet, tmp_path: Path) -> None:
    root = tmp_path / ".gateway"
    settings = Settings(durable_url=servers.durable_url, cache_url=servers.cache_url)
    # A data directory an earlier gateway dev made without a password (trust).
    embedded.PostgresServer(root / "postgres" / "data").start().stop()
    for start in ("upgraded", "again"):  # that directory, then the same one reused
        dev, started, _ = start_stack(root, settings)
        try:
            [pg] = started
            assert isinstance(pg, embedded.PostgresServer) and dev.database_url
            assert await _connects(dev.database_url), start
            bare = f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
            assert not await _connects(bare), start  # as any local user would try
            assert not await _connects(bare.replace("postgres@", "postgres:guess@"))
            sockets = list(pg.socket_dir.glob(".s.PGSQL.*"))
            assert sockets and all(stat.S_IMODE(s.stat().st_mode) == 0o700 for s in sockets
                                   if stat.S_ISSOCK(s.stat().st_mode))
        finally:
            embedded.stop_all(started)
    assert "postgres_password" in json.loads((root / "secrets.json").read_text())


@pytest.mark.skipif(os.geteuid() != 0, reason="starts psql as another local user")
def test_another_local_user_cannot_use_the_socket(servers: ServerSet, tmp_path: Path) -> None:
    settings = Settings(durable_url=servers.durable_url, cache_url=servers.cache_url)
    _, started, _ = start_stack(tmp_path / ".gateway", settings)
    try:
        [pg] = started
        psql = embedded._pg_bin_dir() / "psql"
        tried = subprocess.run([str(psql), "-h", str(pg.socket_dir), "-p", str(pg.port),
                                "-U", "postgres", "-c", "SELECT 1", "-w"],
                               user="nobody", capture_output=True, timeout=30, cwd="/")
        assert tried.returncode != 0
    finally:
        embedded.stop_all(started)
