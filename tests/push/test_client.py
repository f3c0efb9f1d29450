"""The Python push client against the real app: every row exactly once, in order per topic,
whatever happens to the signals, the connection or redis-cache."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any

import pytest

from gateway.push import feed, hub
from gateway.push.client import PushClient
from gateway.push.retention import reset, trim
from gateway.stores.runtime import Runtime, open_runtime
from tests.conftest import ServerSet, make_settings
from tests.helpers import wait_until
from tests.push.conftest import ADMIN_AUTH, base_url, hub_of


async def _collect(client: PushClient, count: int, timeout: float = 20) -> list[Any]:
    rows = []
    for _ in range(count):
        rows.append(await client.get(timeout))
    return rows


async def _write(runtime: Runtime, topic: str, n: int, *, signal_ratio: float = 1.0,
                 rng: random.Random | None = None, tag: str = "", pause: float = 0) -> None:
    """Append ``n`` rows, each in its own transaction; publish only a share of the signals."""
    rng = rng or random.Random(0)
    for i in range(n):
        async with runtime.pg.acquire() as conn, conn.transaction():
            row = await feed.append(conn, topic, "store", {"item_id": f"{tag}{i}"})
        if rng.random() < signal_ratio:
            await feed.publish(runtime.cache, row)
        await asyncio.sleep(pause)  # pacing the writer, not synchronisation


def _assert_exactly_once_in_order(rows: list[Any], topic: str, count: int) -> None:
    offsets = [r.offset for r in rows if r.topic == topic]
    assert offsets == list(range(1, count + 1))


async def test_a_third_of_signals_dropped_still_every_row_once_in_order(
        runtime: Runtime, push_server: Any, push_clients: Callable[..., Any]) -> None:
    server = await push_server()
    client = await push_clients(base_url(server), ["pipeline", "conversation:7"],
                                since={"pipeline": 0, "conversation:7": 0}, poll_seconds=0.5)
    await client.wait_connected()
    await asyncio.gather(
        *(_write(runtime, "pipeline", 40, signal_ratio=2 / 3, rng=random.Random(n), tag=f"w{n}")
          for n in range(3)),
        _write(runtime, "conversation:7", 30, signal_ratio=2 / 3, rng=random.Random(9)))
    rows = await _collect(client, 150)
    _assert_exactly_once_in_order(rows, "pipeline", 120)
    _assert_exactly_once_in_order(rows, "conversation:7", 30)
    with pytest.raises(TimeoutError):
        await client.get(timeout=0.5)  # and nothing more


async def test_client_fills_gaps_itself_when_the_server_misses_signals(
        runtime: Runtime, push_server: Any, push_clients: Callable[..., Any]) -> None:
    """No signal at all and a server that polls only every minute: the client's own
    silence poll of /v1/feed still gets every row."""
    server = await push_server(poll_seconds=60, degraded_poll_seconds=60)
    client = await push_clients(base_url(server), ["pipeline"], poll_seconds=0.3)
    await client.wait_connected()
    await _write(runtime, "pipeline", 10, signal_ratio=0.0)
    rows = await _collect(client, 10)
    _assert_exactly_once_in_order(rows, "pipeline", 10)
    assert client.gap_fills > 1


async def test_restarting_redis_cache_mid_stream_loses_nothing(
        servers: ServerSet, runtime: Runtime, redis_factory: Callable[..., Any],
        push_server: Any, push_clients: Callable[..., Any]) -> None:
    cache_server = redis_factory("cache")
    own = await open_runtime(make_settings(servers, cache_url=cache_server.url))
    try:
        server = await push_server(rt=own)
        hub = hub_of(server)
        await wait_until(lambda: hub.signals_up, message="signals up")
        client = await push_clients(base_url(server), ["pipeline"], since={"pipeline": 0},
                                    poll_seconds=1.0)
        await client.wait_connected()
        writer = asyncio.create_task(_write(own, "pipeline", 300, pause=0.005))
        await wait_until(lambda: client.positions.get("pipeline", 0) >= 30,
                         message="rows flowing before the restart")
        cache_server.kill()
        await wait_until(lambda: not hub.signals_up, message="hub notices the outage")
        head = (await feed.heads(own.pg, ["pipeline"]))["pipeline"].last_offset
        await wait_until(lambda: client.positions.get("pipeline", 0) >= head + 20, timeout=20,
                         message="rows written during the outage arrive by polling")
        assert not hub.signals_up and not writer.done()
        cache_server.start()
        await writer
        rows = await _collect(client, 300)
        _assert_exactly_once_in_order(rows, "pipeline", 300)
        await wait_until(lambda: hub.signals_up, timeout=15, message="signals back")
        await _write(own, "pipeline", 1)
        assert (await client.get(timeout=10)).offset == 301
    finally:
        await own.close()


async def test_reconnect_after_the_server_drops_a_slow_client(
        runtime: Runtime, push_server: Any, push_clients: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "HIGH_WATER", -1)  # every socket counts as backed up
    server = await push_server(client_buffer_rows=3)
    client = await push_clients(base_url(server), ["pipeline"], poll_seconds=5)
    await client.wait_connected()
    async with runtime.pg.acquire() as conn, conn.transaction():
        for i in range(20):
            row = await feed.append(conn, "pipeline", "store", {"i": i})
    await feed.publish(runtime.cache, row)  # 20 rows at once overflow the 3-row buffer
    rows = await _collect(client, 20)
    _assert_exactly_once_in_order(rows, "pipeline", 20)
    await wait_until(lambda: client.connects >= 2, message="the client reconnected")
    assert client.last_disconnect_reason is not None
    assert "too_slow" in client.last_disconnect_reason


async def test_epoch_reset_replays_the_new_epoch(
        runtime: Runtime, push_server: Any, push_clients: Callable[..., Any]) -> None:
    server = await push_server()
    await _write(runtime, "pipeline", 3)
    client = await push_clients(base_url(server), ["pipeline"], since={"pipeline": 0})
    assert [r.offset for r in await _collect(client, 3)] == [1, 2, 3]
    await reset(runtime.pg, runtime.cache, "pipeline")
    await _write(runtime, "pipeline", 2)
    rows = await _collect(client, 2)
    assert [(r.epoch, r.offset) for r in rows] == [(2, 1), (2, 2)]


async def test_a_cursor_behind_retention_reports_the_lost_range(
        runtime: Runtime, push_server: Any, push_clients: Callable[..., Any]) -> None:
    server = await push_server()
    await _write(runtime, "pipeline", 10)
    assert await trim(runtime.pg, max_age_seconds=86400, max_rows=3) == 7
    lost: list[tuple[str, int, int]] = []
    client = await push_clients(base_url(server), ["pipeline"], since={"pipeline": 2},
                                on_trimmed=lambda t, a, b: lost.append((t, a, b)))
    assert [r.offset for r in await _collect(client, 3)] == [8, 9, 10]
    assert lost == [("pipeline", 3, 7)]
    page = await feed.read_page(runtime.pg, "pipeline", 0, 100)
    assert page.trimmed_through == 7 and [r.offset for r in page.rows] == [8, 9, 10]


@pytest.mark.parametrize("leave_after", ["start", "connected", "first_row", "rows_flowing",
                                         "idle", "caller_timeout"])
async def test_leaving_the_block_at_any_point_ends_the_client_at_once(
        runtime: Runtime, push_server: Any, leave_after: str) -> None:
    """However the ``async with`` is left, the client ends within a deadline (on Python 3.11
    ``asyncio.wait_for`` could swallow the cancel when a row arrived at the same moment), and
    a caller's own timeout around ``get`` is honoured."""
    server = await push_server()
    writer: asyncio.Task[None] | None = None
    if leave_after in ("first_row", "rows_flowing", "caller_timeout"):
        writer = asyncio.create_task(_write(runtime, "pipeline", 400, pause=0.002))
    try:
        async with asyncio.timeout(15) as deadline:  # the test's deadline for the whole life
            async with PushClient(base_url(server), ["pipeline"], since={"pipeline": 0},
                                  headers=ADMIN_AUTH,
                                  poll_seconds=0.2) as client:
                if leave_after != "start":
                    await client.wait_connected()
                if leave_after == "first_row":
                    await client.get(10)
                elif leave_after == "rows_flowing":
                    await _collect(client, 50)
                elif leave_after == "caller_timeout":
                    await _collect(client, 5)
                    for _ in range(20):  # rows keep arriving while our timeouts fire
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(0.001):
                                await client.get()
            assert client._task is not None and client._task.done()
        assert not deadline.expired(), "the client outlived the block (and ate our timeout)"
    finally:
        if writer is not None:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
