"""A connection flood does not silence ``/healthz`` or signed deliveries: issue 25 point 2, as
worded. ``gateway serve`` runs in a subprocess under ``RLIMIT_NOFILE`` 1024 (so its caps are
``max`` 614 and ``max + reserve`` 716); 50 idle SSE streams and 1,500 idle TCP connections
from ten addresses (127.0.0.2-127.0.0.11, which all route to lo on Linux) are opened; a fresh
connection to ``/healthz`` and a signed webhook must then both succeed within 2 s."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.stores import embedded
from tests.conftest import TEST_ADMIN_TOKEN, TEST_WEBHOOK_SOURCES, ServerSet
from tests.helpers import wait_until
from tests.inbound.webhook_helpers import body_of, standard

pytestmark = pytest.mark.single_instance
NOFILE = 1024
ADDRESSES = [f"127.0.0.{i}" for i in range(2, 12)]
IDLE_CONNECTIONS, STREAMS = 1500, 50


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@pytest.fixture
async def limited_serve(servers: ServerSet) -> AsyncIterator[str]:
    port = embedded.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(GATEWAY_DURABLE_URL=servers.durable_url, GATEWAY_CACHE_URL=servers.cache_url,
               GATEWAY_DATABASE_URL=servers.database_url, GATEWAY_ADMIN_TOKEN=TEST_ADMIN_TOKEN,
               GATEWAY_WEBHOOK_SECRETS=TEST_WEBHOOK_SOURCES, GATEWAY_LOG_LEVEL="WARNING")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), env=env,
        preexec_fn=_limit_files)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            async def up() -> bool:
                try:
                    async with http.get(f"{url}/healthz") as health:
                        return health.status == 200
                except aiohttp.ClientError:
                    return False

            await wait_until(up, timeout=60, message="serve listening")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(30):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def test_healthz_and_a_signed_webhook_get_through_a_flood_of_idle_connections(
        limited_serve: str) -> None:
    url = limited_serve
    port = int(url.rsplit(":", 1)[1])
    auth = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    idle: list[asyncio.StreamWriter] = []
    try:
        streams = []
        for _ in range(STREAMS):  # idle SSE streams: open, never read
            stream = await http.get(f"{url}/v1/stream", params={"topics": "pipeline"},
                                    headers=auth)
            assert stream.status == 200
            streams.append(stream)

        async def connect(source: str) -> None:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port,
                                                          local_addr=(source, 0))
                idle.append(writer)
            except OSError:
                pass  # a connection the server closed meanwhile is still one of the flood

        for start in range(0, IDLE_CONNECTIONS, 100):
            await asyncio.gather(*(connect(ADDRESSES[i % len(ADDRESSES)])
                                   for i in range(start, start + 100)))
        assert len(idle) >= IDLE_CONNECTIONS * 0.9

        started = time.monotonic()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                local_addr=("127.0.0.20", 0), force_close=True)) as fresh:
            async with asyncio.timeout(2):
                async with fresh.get(f"{url}/healthz") as health:
                    assert health.status == 200, await health.text()
            assert time.monotonic() - started < 2
            started = time.monotonic()
            body = body_of({"text": "delivered through the flood"})
            async with asyncio.timeout(2):
                async with fresh.post(f"{url}/v1/webhooks/demo", data=body,
                                      headers=standard(body, "through-flood")) as delivery:
                    assert delivery.status == 202, await delivery.text()
            assert time.monotonic() - started < 2
        for stream in streams:  # the streams were busy, not idle: none was closed to make room
            assert stream.connection is not None and not stream.content.at_eof()
    finally:
        for writer in idle:
            writer.close()
        await http.close()
