"""``GET /v1/feed`` and ``GET /v1/stream`` on the real app and real stores."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import aiohttp
import pytest
from prometheus_client import REGISTRY

from gateway.push import feed, hub
from gateway.push.client import SseEvent, iter_sse
from gateway.stores.runtime import Runtime
from tests.helpers import wait_until
from tests.push.conftest import hub_of


async def _append(runtime: Runtime, topic: str, n: int, kind: str = "store") -> list[int]:
    offsets = []
    for i in range(n):
        row = await feed.append_and_publish(runtime.pg, runtime.cache, topic, kind,
                                            {"item_id": f"i{i}", "stage": kind})
        offsets.append(row.offset)
    return offsets


async def _burst(runtime: Runtime, topic: str, n: int) -> None:
    """``n`` rows committed in one transaction and one signal (the last row's), so the hub
    reads them all at once."""
    async with runtime.pg.acquire() as conn, conn.transaction():
        for i in range(n):
            row = await feed.append(conn, topic, "store", {"i": i})
    await feed.publish(runtime.cache, row)


async def _events(resp: aiohttp.ClientResponse, count: int, timeout: float = 10) -> list[SseEvent]:
    got: list[SseEvent] = []

    async def collect() -> None:
        async for event in iter_sse(resp.content):
            if event is not None:
                got.append(event)
                if len(got) == count:
                    return

    await asyncio.wait_for(collect(), timeout)
    return got


async def test_feed_endpoint_reads_in_order_with_epoch(runtime: Runtime, push_server: Any) -> None:
    client = await push_server()
    await _append(runtime, "pipeline", 5)
    resp = await client.get("/v1/feed", params={"topic": "pipeline", "after": "2", "limit": "2"})
    assert resp.status == 200
    body = await resp.json()
    assert body["topic"] == "pipeline" and body["epoch"] == 1
    assert [r["offset"] for r in body["rows"]] == [3, 4]
    assert body["rows"][0]["payload"] == {"item_id": "i2", "stage": "store"}
    assert set(body["rows"][0]) == {"topic", "offset", "epoch", "kind", "payload", "created_at"}
    empty = await (await client.get("/v1/feed", params={"topic": "conversation:x"})).json()
    assert empty["rows"] == [] and empty["epoch"] == 1


async def test_feed_endpoint_refuses_bad_input_as_json(push_server: Any) -> None:
    client = await push_server()
    for params in ({}, {"topic": "pipeline", "after": "x"}, {"topic": "pipeline", "limit": "0"},
                   {"topic": "pipeline", "limit": "5000"}, {"topic": "pipeline", "after": "-1"},
                   {"topic": "pipeline", "after": str(2**63)}, {"topic": "a,b"}):
        resp = await client.get("/v1/feed", params=params)
        assert resp.status == 400, params
        body = await resp.json()
        assert body["error"] == "bad_request" and body["detail"], params


async def test_stream_refuses_bad_input_as_json(push_server: Any) -> None:
    client = await push_server()
    for params, headers in (({}, {}), ({"topics": "bad topic"}, {}),
                            ({"topics": "pipeline"}, {"Last-Event-ID": "pipeline:x"}),
                            ({"topics": "pipeline"}, {"Last-Event-ID": "pipeline:\u00b2"}),
                            ({"topics": "pipeline", "since": f"pipeline:{2**63}"}, {}),
                            ({"topics": "pipeline", "since": "nocolon"}, {})):
        resp = await client.get("/v1/stream", params=params, headers=headers)
        assert resp.status == 400, params
        assert (await resp.json())["error"] == "bad_request"


async def test_stream_format_headers_and_cursor(runtime: Runtime, push_server: Any) -> None:
    client = await push_server()
    await _append(runtime, "pipeline", 2)
    await _append(runtime, "conversation:c:1", 1, kind="message")
    resp = await client.get("/v1/stream", params={"topics": "pipeline,conversation:c:1",
                                                  "since": "pipeline:0,conversation:c:1:0"})
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.headers["X-Accel-Buffering"] == "no"
    events = await _events(resp, 3)
    assert [e.event for e in events] == ["store", "store", "message"]
    assert [e.id for e in events] == ["pipeline:1,conversation:c:1:0",
                                      "pipeline:2,conversation:c:1:0",
                                      "pipeline:2,conversation:c:1:1"]
    row = json.loads(events[2].data)
    assert row["topic"] == "conversation:c:1" and row["offset"] == 1 and row["epoch"] == 1
    # Live rows follow the replay on the same stream.
    await _append(runtime, "pipeline", 1, kind="chunk")
    live = await _events(resp, 1)
    assert live[0].event == "chunk" and live[0].id == "pipeline:3,conversation:c:1:1"
    resp.close()


async def test_without_cursor_the_stream_starts_live(runtime: Runtime, push_server: Any) -> None:
    client = await push_server()
    await _append(runtime, "pipeline", 3)
    resp = await client.get("/v1/stream", params={"topics": "pipeline"})
    assert resp.headers["X-Stream-Cursor"] == "pipeline:3"
    await _append(runtime, "pipeline", 1)
    events = await _events(resp, 1)
    assert json.loads(events[0].data)["offset"] == 4
    resp.close()


async def test_resume_by_last_event_id_loses_and_repeats_nothing(runtime: Runtime,
                                                                 push_server: Any) -> None:
    client = await push_server()
    await _append(runtime, "pipeline", 3)
    first = await client.get("/v1/stream", params={"topics": "pipeline", "since": "pipeline:0"})
    seen = await _events(first, 2)
    last_id = seen[-1].id
    first.close()  # disconnect after offset 2
    await _append(runtime, "pipeline", 2)  # 4, 5 while away
    second = await client.get("/v1/stream", params={"topics": "pipeline"},
                              headers={"Last-Event-ID": last_id or ""})
    resumed = await _events(second, 3)
    assert [json.loads(e.data)["offset"] for e in resumed] == [3, 4, 5]
    second.close()


async def test_too_slow_client_is_disconnected_with_a_reason(
        runtime: Runtime, push_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A client that does not keep up: its socket counts as above the high-water mark, so the
    # hub buffers rows for it instead of writing them straight away.
    monkeypatch.setattr(hub, "HIGH_WATER", -1)
    closed_before = REGISTRY.get_sample_value(
        "gateway_push_streams_closed_total", {"reason": "too_slow"}) or 0
    client = await push_server(client_buffer_rows=3)
    resp = await client.get("/v1/stream", params={"topics": "pipeline"})
    # Ten rows committed together reach the hub in one read: more than the 3-row buffer.
    await _burst(runtime, "pipeline", 10)
    got: list[SseEvent] = []
    async for event in iter_sse(resp.content):
        if event is not None:
            got.append(event)
    assert got[-1].event == "gateway.disconnect"
    assert json.loads(got[-1].data)["reason"] == "too_slow"
    await wait_until(lambda: hub_of(client).subscriber_count == 0, message="unsubscribed")
    assert REGISTRY.get_sample_value(
        "gateway_push_streams_closed_total", {"reason": "too_slow"}) == closed_before + 1
    metrics_text = await (await client.get("/metrics")).text()
    assert "gateway_push_signals_total" in metrics_text


async def test_reset_raises_the_epoch_and_streams_restart(runtime: Runtime,
                                                          push_server: Any) -> None:
    from gateway.push.retention import reset

    client = await push_server()
    await _append(runtime, "pipeline", 3)
    resp = await client.get("/v1/stream", params={"topics": "pipeline", "since": "pipeline:3"})
    assert await reset(runtime.pg, runtime.cache, "pipeline") == 2
    await _append(runtime, "pipeline", 2, kind="graph")
    events = await _events(resp, 2)
    rows = [json.loads(e.data) for e in events]
    assert [(r["epoch"], r["offset"]) for r in rows] == [(2, 1), (2, 2)]
    resp.close()
    body: dict[str, Any] = await (await client.get(
        "/v1/feed", params={"topic": "pipeline"})).json()
    assert body["epoch"] == 2 and [r["offset"] for r in body["rows"]] == [1, 2]


async def test_idle_stream_gets_heartbeat_comments(push_server: Any) -> None:
    client = await push_server(heartbeat_seconds=0.2)
    resp = await client.get("/v1/stream", params={"topics": "pipeline"})
    lines: list[bytes] = []

    async def two_heartbeats() -> None:
        async for line in resp.content:
            lines.append(line)
            if lines.count(b": heartbeat\n") == 2:
                return

    await asyncio.wait_for(two_heartbeats(), 10)
    assert lines[0] == b": connected\n"
    resp.close()


async def test_client_gone_is_unsubscribed(push_server: Any) -> None:
    client = await push_server()
    resp = await client.get("/v1/stream", params={"topics": "pipeline"})
    hub = hub_of(client)
    assert hub.subscriber_count == 1
    resp.close()
    await wait_until(lambda: hub.subscriber_count == 0, message="subscriber released")
    assert "pipeline" not in hub.topics


async def test_streams_open_at_once_and_poll_while_redis_cache_is_down(
        servers: Any, push_server: Any, redis_factory: Any) -> None:
    from gateway.stores.runtime import open_runtime
    from tests.conftest import make_settings

    cache = redis_factory("cache")
    own = await open_runtime(make_settings(servers, cache_url=cache.url))
    try:
        client = await push_server(rt=own, subscribe_timeout_seconds=5)
        cache.kill()
        await wait_until(lambda: not hub_of(client).signals_up, message="signals down")
        started = time.monotonic()
        resp = await client.get("/v1/stream", params={"topics": "conversation:9"})
        assert resp.status == 200
        assert time.monotonic() - started < 2  # no wait for a subscription that cannot come
        await _append(own, "conversation:9", 2, kind="message")  # the PUBLISH fails: swallowed
        events = await _events(resp, 2)
        assert [json.loads(e.data)["offset"] for e in events] == [1, 2]
        resp.close()
    finally:
        await own.close()


async def test_server_shutdown_ends_streams_with_a_reason(push_server: Any) -> None:
    client = await push_server()
    resp = await client.get("/v1/stream", params={"topics": "pipeline"})
    closing = asyncio.create_task(client.server.close())
    got: list[SseEvent] = []
    async for event in iter_sse(resp.content):
        if event is not None:
            got.append(event)
    await asyncio.wait_for(closing, 10)
    assert got[-1].event == "gateway.disconnect"
    goodbye = json.loads(got[-1].data)
    assert goodbye["reason"] == goodbye["error"] == "shutdown"


async def test_rows_arrive_by_signal_alone(runtime: Runtime, push_server: Any) -> None:
    """With every poll a minute away, a row that arrives at once came through PUBLISH and
    the hub's one Redis subscription (on a single instance and on a cluster)."""
    client = await push_server(poll_seconds=60, degraded_poll_seconds=60)
    await wait_until(lambda: hub_of(client).signals_up, message="signals up")
    resp = await client.get("/v1/stream", params={"topics": "conversation:sig"})
    await _append(runtime, "conversation:sig", 3, kind="message")
    # Too large to ride in its signal: the hub reads this one from the feed.
    big = await feed.append_and_publish(runtime.pg, runtime.cache, "conversation:sig",
                                        "message", {"text": "x" * 20000})
    events = await _events(resp, 4)
    rows = [json.loads(e.data) for e in events]
    assert [r["offset"] for r in rows] == [1, 2, 3, big.offset]
    assert rows[3]["payload"]["text"] == "x" * 20000
    resp.close()


async def test_a_burst_larger_than_the_buffer_reaches_a_client_that_keeps_up(
        runtime: Runtime, push_server: Any) -> None:
    # The hub writes each row straight to the socket of an idle stream: nothing waits in
    # the 3-row buffer, so a 10-row burst is delivered whole, once each, in order.
    client = await push_server(client_buffer_rows=3)
    resp = await client.get("/v1/stream", params={"topics": "pipeline"})
    await _burst(runtime, "pipeline", 10)
    got = await _events(resp, 10)
    assert [json.loads(e.data)["offset"] for e in got] == list(range(1, 11))
    assert [e.id for e in got] == [f"pipeline:{i}" for i in range(1, 11)]
    assert hub_of(client).subscriber_count == 1
    resp.close()


async def test_idle_streams_share_the_topics_lane_and_leave_it_for_a_reset(
        runtime: Runtime, push_server: Any) -> None:
    """Idle single-topic streams wait in the topic's lane, where the hub writes each next
    row to all of them in one loop: every row reaches each once, in order, and they stay in
    the lane. A stream on two topics stays outside and gets the same rows. A reset (a new
    epoch) empties the lane; the streams then replay the new epoch and come back."""
    from gateway.push.retention import reset

    client = await push_server()
    streams = [await client.get("/v1/stream", params={"topics": "pipeline"}) for _ in range(4)]
    double = await client.get("/v1/stream", params={"topics": "pipeline,conversation:a"})
    state = hub_of(client).topics["pipeline"]
    await wait_until(lambda: len(state.lane) == 4, message="4 streams in the lane")
    assert len(state.outside) == 1
    await _burst(runtime, "pipeline", 12)
    expected = list(range(1, 13))
    for resp in [*streams, double]:
        assert [json.loads(e.data)["offset"] for e in await _events(resp, 12)] == expected
    assert len(state.lane) == 4 and state.lane_offset == 12
    assert await reset(runtime.pg, runtime.cache, "pipeline") == 2
    await _append(runtime, "pipeline", 2)
    for resp in [*streams, double]:
        assert [(json.loads(e.data)["epoch"], json.loads(e.data)["offset"])
                for e in await _events(resp, 2)] == [(2, 1), (2, 2)]
    await wait_until(lambda: len(state.lane) == 4, message="back in the lane")
    assert (state.lane_epoch, state.lane_offset) == (2, 2)
    for resp in [*streams, double]:
        resp.close()


async def test_rows_stay_in_order_when_a_stream_switches_between_direct_and_buffered(
        runtime: Runtime, push_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two streams (one on two topics, so it builds its own events); the socket "backs up"
    # and recovers between batches, moving rows between the hub's direct write and the
    # stream task's buffered write. Every row must still arrive once, in order.
    client = await push_server()
    single = await client.get("/v1/stream", params={"topics": "pipeline"})
    double = await client.get("/v1/stream", params={"topics": "pipeline,conversation:a"})
    expected: list[int] = []
    for high_water in (hub.HIGH_WATER, -1, hub.HIGH_WATER, -1):
        monkeypatch.setattr(hub, "HIGH_WATER", high_water)
        expected += await _append(runtime, "pipeline", 5)
    got_single = await _events(single, len(expected))
    got_double = await _events(double, len(expected))
    assert [json.loads(e.data)["offset"] for e in got_single] == expected == list(range(1, 21))
    assert [json.loads(e.data)["offset"] for e in got_double] == expected
    assert got_double[-1].id == "pipeline:20,conversation:a:0"
    single.close()
    double.close()


async def test_a_topic_whose_first_head_read_failed_is_read_by_the_poll(
        runtime: Runtime, push_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    client = await push_server(subscribe_timeout_seconds=0.3)
    hub = hub_of(client)
    real_heads, failed = feed.heads, []

    async def heads_failing_once(pool: Any, topics: list[str]) -> Any:
        if not failed:
            failed.append(topics)
            raise OSError("postgres went away for a moment")
        return await real_heads(pool, topics)

    # Signals up first: their coming up re-reads every topic, which would hide the bug.
    await hub.subscribe(["other"])
    await wait_until(lambda: hub.signals_up and hub.topics["other"].head is not None)
    monkeypatch.setattr(feed, "heads", heads_failing_once)
    sub = await hub.subscribe(["pipeline"])
    assert failed == [["pipeline"]]
    await wait_until(lambda: hub.topics["pipeline"].head is not None, timeout=10)
    async with runtime.pg.acquire() as conn:  # a row without a signal: only a poll finds it
        await feed.append(conn, "pipeline", "store", {"item_id": "late", "stage": "store"})
    rows = await asyncio.wait_for(sub.take(), 10)
    assert [row.payload["item_id"] for row in rows] == ["late"]
    hub.unsubscribe(sub)


async def test_stream_caps_tell_apart_the_clients_of_a_trusted_proxy(
        push_server: Any, runtime: Runtime) -> None:
    """Behind a trusted proxy every stream comes from the proxy's address: the per-client cap
    counts the client the proxy names (X-Forwarded-For, right to left), not the proxy."""
    proxied = dataclasses.replace(runtime, settings=dataclasses.replace(
        runtime.settings, sections={**runtime.settings.sections,
                                    "security": {"trusted_proxies": ["127.0.0.1"]}}))
    client = await push_server(rt=proxied, max_streams_per_client=2, max_streams=10)

    async def stream(address: str) -> Any:
        return await client.get("/v1/stream", params={"topics": "pipeline"},
                                headers={"X-Forwarded-For": address})

    greedy = [await stream("203.0.113.5") for _ in range(2)]
    assert [r.status for r in greedy] == [200, 200]
    refused = await stream("203.0.113.5")
    assert refused.status == 429
    bystander = await stream("203.0.113.6")
    assert bystander.status == 200
    for resp in [*greedy, refused, bystander]:
        resp.close()


async def test_streams_are_capped_per_client_and_per_process(push_server: Any) -> None:
    """Idle streams cannot take every file descriptor: past the per-client cap 429, past the
    process cap 503, both with Retry-After; other routes still answer."""
    client = await push_server(max_streams_per_client=2, max_streams=3)
    opened = [await client.get("/v1/stream", params={"topics": "pipeline"}) for _ in range(2)]
    assert [r.status for r in opened] == [200, 200]
    third = await client.get("/v1/stream", params={"topics": "pipeline"})
    assert third.status == 429 and int(third.headers["Retry-After"]) > 0
    health = await client.get("/healthz")
    assert health.status == 200
    opened[0].close()  # a stream that ends frees its place

    async def admitted() -> bool:
        resp = await client.get("/v1/stream", params={"topics": "pipeline"})
        if resp.status == 200:
            opened.append(resp)
            return True
        resp.close()
        return False

    await wait_until(admitted, timeout=5, message="a place freed")
    crowded = await push_server(max_streams_per_client=10, max_streams=1)
    first = await crowded.get("/v1/stream", params={"topics": "pipeline"})
    assert first.status == 200
    full = await crowded.get("/v1/stream", params={"topics": "pipeline"})
    assert full.status == 503 and int(full.headers["Retry-After"]) > 0
    for resp in [*opened, first]:
        resp.close()
