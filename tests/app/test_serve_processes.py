"""``gateway serve --processes 2``: two real serve processes listen on one port, connections
spread over both, a child that dies is replaced, and SIGTERM stops every child the way one
serve stops (streams told ``shutdown``), the supervisor exiting 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from asyncio.subprocess import Process
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.push.client import iter_sse
from gateway.stores import embedded
from tests.conftest import TEST_ADMIN_TOKEN, ServerSet
from tests.helpers import wait_until

AUTH = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _sockets(pid: int) -> set[int]:
    """Inodes of the sockets a process holds."""
    found: set[int] = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # gone meanwhile
        return found
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def _tcp(port: int, state: str) -> set[int]:
    """Inodes of IPv4 TCP sockets on local ``port`` in ``state`` (0A listen, 01 established)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
            found.add(int(fields[9]))
    return found


@pytest.fixture
async def supervisor(servers: ServerSet) -> AsyncIterator[tuple[Process, int]]:
    port = embedded.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(GATEWAY_DURABLE_URL=servers.durable_url, GATEWAY_CACHE_URL=servers.cache_url,
               GATEWAY_DATABASE_URL=servers.database_url, GATEWAY_ADMIN_TOKEN=TEST_ADMIN_TOKEN,
               GATEWAY_LOG_LEVEL="WARNING")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--processes", "2", "--port", str(port),
        env=env)
    try:
        await wait_until(lambda: len(_listeners(proc.pid, port)) == 2, timeout=60,
                         message="two serve processes listening")
        yield proc, port
    finally:
        if proc.returncode is None:
            children = _children(proc.pid)
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(60):
                    await proc.wait()
            except TimeoutError:
                for pid in [proc.pid, *children]:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                await proc.wait()


def _listeners(pid: int, port: int) -> list[int]:
    """Children of ``pid`` that hold a listening socket on ``port``."""
    try:
        children = _children(pid)
    except OSError:
        return []
    listening = _tcp(port, "0A")
    return [c for c in children if _sockets(c) & listening]


async def _open_streams(http: aiohttp.ClientSession, url: str, n: int
                        ) -> list[aiohttp.ClientResponse]:
    streams = []
    for _ in range(n):
        resp = await http.get(f"{url}/v1/stream", params={"topics": "pipeline"}, headers=AUTH)
        assert resp.status == 200
        streams.append(resp)
    return streams


async def test_two_processes_share_the_port_and_replace_a_dead_one(
        supervisor: tuple[Process, int]) -> None:
    proc, port = supervisor
    url = f"http://127.0.0.1:{port}"
    first = _listeners(proc.pid, port)
    # One connection per stream (no pooling), so the kernel places each anew.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        streams = await _open_streams(http, url, 16)
        established = _tcp(port, "01")
        per_child = {c: len(_sockets(c) & established) for c in first}
        assert sorted(per_child.values())[0] >= 1, per_child  # 16 coins, both sides
        assert sum(per_child.values()) == 16
        for resp in streams:
            resp.close()
        os.kill(first[0], signal.SIGKILL)
        await wait_until(lambda: len(_listeners(proc.pid, port)) == 2
                         and first[0] not in _listeners(proc.pid, port), timeout=60,
                         message="the dead child replaced")
        async with http.get(f"{url}/readyz") as resp:
            assert resp.status == 200
    assert proc.returncode is None


async def test_sigterm_stops_every_process_and_ends_their_streams_with_shutdown(
        supervisor: tuple[Process, int]) -> None:
    proc, port = supervisor
    children = _listeners(proc.pid, port)
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        streams = await _open_streams(http, url, 12)
        established = _tcp(port, "01")
        assert all(_sockets(c) & established for c in children)  # streams on both
        proc.send_signal(signal.SIGTERM)

        async def goodbye(resp: aiohttp.ClientResponse) -> str:
            async for event in iter_sse(resp.content):
                if event is not None and event.event == "gateway.disconnect":
                    return str(json.loads(event.data)["reason"])
            return "ended without a goodbye"

        async with asyncio.timeout(30):
            reasons = await asyncio.gather(*(goodbye(resp) for resp in streams))
        assert reasons == ["shutdown"] * 12
    async with asyncio.timeout(60):
        assert await proc.wait() == 0
    assert all(_state(c) in ("gone", "Z") for c in children)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_child_that_cannot_start_stops_the_supervisor_with_its_status(
        servers: ServerSet, redis_factory) -> None:  # type: ignore[no-untyped-def]
    evicting = redis_factory("durable", **{"maxmemory-policy": "allkeys-lru"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(GATEWAY_DURABLE_URL=evicting.url, GATEWAY_CACHE_URL=servers.cache_url,
               GATEWAY_DATABASE_URL=servers.database_url, GATEWAY_PORT="0")
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--processes", "2"],
                            env=env, capture_output=True, text=True, timeout=90)
    assert result.returncode == 1
    assert "refusing to start" in result.stderr
    assert "Traceback" not in result.stderr


async def test_children_stop_when_the_supervisor_is_killed(
        supervisor: tuple[Process, int]) -> None:
    """SIGKILL leaves the supervisor no time to pass anything on: the children still stop
    (their parent-death signal is SIGTERM), rather than serving on unsupervised."""
    proc, port = supervisor
    children = _listeners(proc.pid, port)
    assert len(children) == 2
    proc.kill()
    await proc.wait()
    await wait_until(lambda: all(_state(c) in ("gone", "Z") for c in children), timeout=30,
                     message="both children stopped after the supervisor died")
