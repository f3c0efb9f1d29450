"""No PostgreSQL call waits without a bound: a connection is waited for at most the pool's
``acquire_seconds`` (the read pool's 2 s, then 503 + Retry-After) and opened within
``CONNECT_SECONDS``; API-key checks read through the read pool, so a flood of made-up keys
queues there, not on the connections the record's writers need."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.stores import postgres
from gateway.stores.runtime import READ_PG_CONNECTIONS, READ_WAIT_SECONDS, Runtime
from tests.conftest import ServerSet
from tests.inbound.webhook_helpers import body_of, standard

SLACK = 1.5
UNKNOWN_KEY = "gk_0123456789ab_" + "x" * 32


async def test_a_pool_waits_for_a_connection_at_most_its_budget(servers: ServerSet) -> None:
    pool = await postgres.create_pool(servers.database_url, max_size=1, acquire_seconds=0.3)
    try:
        async with pool.acquire() as held:
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await pool.fetchval("SELECT 1")  # the shortcuts acquire through it too
            assert 0.25 < time.monotonic() - started < 0.3 + SLACK
            with pytest.raises(TimeoutError):
                async with pool.acquire(timeout=0.05):  # the caller's own timeout wins
                    pass
            assert await held.fetchval("SELECT 2") == 2
        assert await pool.fetchval("SELECT 3") == 3
    finally:
        await pool.close()


async def test_a_server_that_accepts_and_says_nothing_fails_the_connect_in_time() -> None:
    """A stalled server completes the TCP handshake (the kernel does) and never answers the
    startup message: asyncpg's default would wait 60 s."""
    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await postgres.create_pool(f"postgresql://postgres@127.0.0.1:{port}/postgres",
                                       connect_seconds=0.5)
        assert time.monotonic() - started < 0.5 + SLACK
    finally:
        silent.close()


async def timed(client: Any, path: str, **kwargs: Any) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    async with asyncio.timeout(READ_WAIT_SECONDS + 10):  # a hang fails, not stalls, the test
        async with client.get(path, **kwargs) as response:
            return response.status, dict(response.headers), time.monotonic() - started


async def test_an_exhausted_read_pool_refuses_reads_and_unknown_keys_in_time(
        make_client: Callable[..., Any], runtime: Runtime) -> None:
    assert runtime.read_pg is not None and runtime.read_pg is not runtime.pg
    client = await make_client()
    assert (await timed(client, "/v1/feed?topic=pipeline"))[0] == 200
    held = [await runtime.read_pg.acquire() for _ in range(READ_PG_CONNECTIONS)]
    try:
        for headers in ({}, {"Authorization": f"Bearer {UNKNOWN_KEY}"}):
            status, answer, seconds = await timed(client, "/v1/feed?topic=pipeline",
                                                  headers=headers)
            # 503, not 401: the key could not be looked up, which says nothing against it
            assert status == 503 and answer["Retry-After"], (headers, status)
            assert READ_WAIT_SECONDS - 0.2 < seconds < READ_WAIT_SECONDS + SLACK, seconds
        body = body_of({"text": "busy"})
        started = time.monotonic()
        async with client.post("/v1/webhooks/demo", data=body,
                               headers=standard(body, "busy")) as delivered:
            assert delivered.status == 202
        assert time.monotonic() - started < SLACK
        async with runtime.pg.acquire() as conn:  # the record's own pool is untouched
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        for conn in held:
            await runtime.read_pg.release(conn)
    assert (await timed(client, "/v1/feed?topic=pipeline"))[0] == 200
    status, _, _ = await timed(client, "/v1/feed?topic=pipeline",
                               headers={"Authorization": f"Bearer {UNKNOWN_KEY}"})
    assert status == 401


@pytest.fixture
async def one_connection_pools(servers: ServerSet) -> AsyncIterator[tuple[Any, Any]]:
    """Two pools of one connection each (the second watches the first's session locks) and
    no probe table left behind."""
    pool = await postgres.create_pool(servers.database_url, max_size=1)
    other = await postgres.create_pool(servers.database_url, max_size=1)
    try:
        yield pool, other
    finally:
        await pool.execute("DROP TABLE IF EXISTS commit_probe")
        await pool.close()
        await other.close()


async def test_a_commit_takes_the_pools_reset_along_and_a_clean_borrow_skips_it(
        one_connection_pools: tuple[Any, Any]) -> None:
    """``reset_at_commit``: the transaction's COMMIT carries the session reset (the release
    skips its own) and what the transaction wrote is committed; a transaction that rolls
    back leaves its mark to nobody (the next borrower's COMMIT is a plain one). ``leave_clean``:
    the release skips the reset unless a query runs after it."""
    pool, other = one_connection_pools
    lock = "SELECT pg_try_advisory_lock(4343)"
    await pool.execute("CREATE TABLE IF NOT EXISTS commit_probe (n int)")
    async with pool.acquire() as conn:
        async with conn.transaction():
            conn.reset_at_commit()
            await conn.execute("SET application_name = 'borrowed'")
            assert await conn.fetchval(lock)
            await conn.execute("INSERT INTO commit_probe VALUES (1)")
        assert conn.take_reset()  # the COMMIT reset the session
        assert not conn.is_in_transaction()
    assert await other.fetchval(lock)  # the session's lock went with the COMMIT
    await other.execute("SELECT pg_advisory_unlock_all()")
    async with pool.acquire() as conn:
        assert await conn.fetchval("SHOW application_name") != "borrowed"
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                conn.reset_at_commit()
                await conn.execute("INSERT INTO commit_probe VALUES (2)")
                raise RuntimeError("rolled back")
    async with pool.acquire() as conn:
        async with conn.transaction():  # a plain COMMIT: the session lock stays
            assert await conn.fetchval(lock)
            await conn.execute("INSERT INTO commit_probe VALUES (3)")
        assert not await other.fetchval(lock)
        conn.leave_clean()
        assert await conn.fetchval("SELECT 1")  # a query after it: the release resets
    assert await other.fetchval(lock)
    await other.execute("SELECT pg_advisory_unlock_all()")
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT 1")
        conn.leave_clean()
        assert conn.take_reset()
    assert sorted(await pool.fetchval("SELECT array_agg(n) FROM commit_probe")) == [1, 3]
