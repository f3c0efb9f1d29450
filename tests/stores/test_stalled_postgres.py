"""A stopped PostgreSQL (SIGSTOP on the postmaster and every backend) costs client reads a
bounded wait and a 503 + Retry-After, while signed webhooks, which need only redis-durable,
are still accepted and liveness still answers; after SIGCONT everything works again.

The database is one of this module's own: stopping the session's would stall the other
tests' fixtures, and an external ``GATEWAY_TEST_DATABASE_URL`` cannot be stopped at all."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.stores import embedded
from gateway.stores.migrate import migrate_url
from gateway.stores.runtime import (
    READ_PG_BUDGET_SECONDS,
    READ_PG_CONNECTIONS,
    READ_WAIT_SECONDS,
    Runtime,
    open_runtime,
)
from gateway.web.app import create_app
from tests.helpers import wait_until
from tests.inbound.webhook_helpers import body_of, standard

SLACK = 1.5  # scheduling on a loaded machine; far below any budget the reads could miss
UNKNOWN_KEY = "gk_0123456789ab_" + "x" * 32


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[embedded.PostgresServer]:
    root = Path(tempfile.mkdtemp(prefix="gws-"))  # short: the unix socket lives under it
    server = embedded.PostgresServer(root / "data").start()
    try:
        asyncio.run(migrate_url(server.url))
        yield server
    finally:
        embedded.stop_all([server])


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@contextlib.contextmanager
def stopped(server: embedded.PostgresServer) -> Iterator[None]:
    """The postmaster stopped first (it forks no backend while stopped), then every child:
    backends, checkpointer, WAL writer. All continued on the way out, whatever happened."""
    assert server.proc is not None
    postmaster = server.proc.pid
    os.kill(postmaster, signal.SIGSTOP)
    children: list[int] = []
    try:
        children = _children(postmaster)
        assert children, "a running PostgreSQL has backends and auxiliary processes"
        for pid in children:
            os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        os.kill(postmaster, signal.SIGCONT)


async def timed(client: Any, method: str, path: str, **kwargs: Any) -> tuple[int, str, float]:
    """(status, Retry-After, seconds); a hang fails the test instead of stalling it."""
    started = time.monotonic()
    async with asyncio.timeout(READ_PG_BUDGET_SECONDS + 10):
        async with client.request(method, path, **kwargs) as response:
            await response.read()
            return (response.status, response.headers.get("Retry-After", ""),
                    time.monotonic() - started)


async def deliver(client: Any, msg_id: str) -> tuple[int, str, float]:
    body = body_of({"text": msg_id})
    return await timed(client, "POST", "/v1/webhooks/demo", data=body,
                       headers=standard(body, msg_id))


READS = ["/v1/feed?topic=pipeline", "/v1/jobs/webhook:demo:never-sent"]


async def test_a_stopped_database_gives_readers_fast_503s_and_deliveries_go_on(
        own_postgres: embedded.PostgresServer, runtime: Runtime,
        make_client: Callable[..., Any]) -> None:
    rt = await open_runtime(dataclasses.replace(runtime.settings,
                                                database_url=own_postgres.url))
    try:
        client = await make_client(create_app(rt), rt=rt)
        # Warm: the read pool holds live connections, which the stop catches mid-statement.
        assert [(await timed(client, "GET", path))[0] for path in READS] == [200, 404]
        assert (await deliver(client, "before-stop"))[0] == 202

        with stopped(own_postgres):
            reads = [asyncio.create_task(timed(client, "GET", READS[i % 2]))
                     for i in range(2 * READ_PG_CONNECTIONS)]
            # An unknown API key is a PostgreSQL read too: bounded like the others.
            unknown_key = asyncio.create_task(timed(
                client, "GET", READS[0], headers={"Authorization": f"Bearer {UNKNOWN_KEY}"}))
            # Meanwhile deliveries, liveness and a status Redis knows need no PostgreSQL.
            delivered = await deliver(client, "during-stop")
            assert delivered[0] == 202 and delivered[2] < SLACK, delivered
            health = await timed(client, "GET", "/healthz")
            assert health[0] == 200 and health[2] < SLACK, health
            known = await timed(client, "GET", "/v1/jobs/webhook:demo:during-stop")
            assert known[0] == 200 and known[2] < SLACK, known

            answers = [*await asyncio.gather(*reads), await unknown_key]
            assert [(status, bool(retry)) for status, retry, _ in answers] == [
                (503, True)] * len(answers), answers
            seconds = sorted(elapsed for _, _, elapsed in answers)
            assert seconds[-1] < READ_PG_BUDGET_SECONDS + SLACK, seconds
            # Only a read that had a connection waits out its statement; the others are
            # refused once the wait for a connection (or for a new one to open) runs out.
            assert seconds[-READ_PG_CONNECTIONS - 1] < READ_WAIT_SECONDS + SLACK, seconds
            later = await timed(client, "GET", READS[1])  # the read pool is stuck now
            assert later[0] == 503 and later[2] < READ_WAIT_SECONDS + SLACK, later

        async def all_read() -> bool:
            return [(await timed(client, "GET", path))[0] for path in READS] == [200, 404]

        await wait_until(all_read, timeout=READ_PG_BUDGET_SECONDS + 5,
                         message="reads to work again after SIGCONT")
        assert (await timed(client, "GET", "/v1/jobs/webhook:demo:during-stop"))[0] == 200
        assert (await deliver(client, "after-stop"))[0] == 202
    finally:
        await rt.close()
