"""``GET /`` and ``GET /v1/dashboard/summary`` on real stores (the browser test is separate)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from gateway import keys
from gateway.config import Secret
from gateway.leases import maintenance
from gateway.push import feed
from gateway.push.web import HUB
from gateway.stores.runtime import Runtime
from gateway.web import dashboard
from gateway.web.app import COMPONENTS, create_app
from tests.helpers import wait_until

DOC = {"text": "dashboard test document"}


async def _dashboard(make_client: Callable[..., Any], runtime: Runtime) -> Any:
    components = COMPONENTS if "gateway.web.dashboard" in COMPONENTS else (
        *COMPONENTS, "gateway.web.dashboard")
    return await make_client(app=create_app(runtime, components))


async def test_page_and_scripts_are_served(make_client: Callable[..., Any],
                                           runtime: Runtime) -> None:
    client = await _dashboard(make_client, runtime)
    page = await client.get("/")
    assert page.status == 200
    html = await page.text()
    assert 'id="queues"' in html and 'id="feed"' in html and "/static/push.js" in html
    script = await client.get("/static/push.js")
    assert script.status == 200 and "class GatewayPush" in await script.text()


async def test_summary_shows_queues_throughput_listener_and_feed(
        make_client: Callable[..., Any], runtime: Runtime) -> None:
    client = await _dashboard(make_client, runtime)
    for job_id in ("a", "b"):
        posted = await client.post("/v1/jobs", json={"job_id": job_id, "document": DOC})
        assert posted.status == 202
    for stage in ("store", "store", "chunk"):
        await feed.append_and_publish(runtime.pg, runtime.cache, "pipeline", stage,
                                      {"item_id": "x", "stage": stage})
    body = await (await client.get("/v1/dashboard/summary")).json()
    assert body["stages"]["store"]["ready"] == 2
    assert body["stages"]["graph"] == {"ready": 0, "inflight": 0, "delayed": 0, "dead": 0}
    assert body["dead_letters"] == 0
    assert body["throughput"]["completions"] == {"store": 2, "chunk": 1}
    # The chart: completions per minute over the last 15, the current minute last.
    series = body["throughput"]["series"]
    assert len(series) == 15 and [p["completions"] for p in series][-1] == 3
    assert sum(p["completions"] for p in series) == 3
    assert series[-1]["minute"] > series[0]["minute"]
    # MATTERMOST_URL is not set: "not configured", not "not running".
    assert body["listener"] == {"configured": False, "running": False, "connected": False}
    assert body["feed"] == {"topic": "pipeline", "epoch": 1, "last_offset": 3}
    assert body["errors"] == {}

    flag = {"instance": "mm-1", "connected": True, "since": 1.0, "last_event_at": None,
            "reconnects": 2}
    await runtime.cache.set(keys.mattermost_listener(), json.dumps(flag), ex=90)
    unconfigured = (await (await client.get("/v1/dashboard/summary")).json())["listener"]
    assert unconfigured["configured"] is False
    configured = dataclasses.replace(runtime, settings=dataclasses.replace(
        runtime.settings, mattermost_url="http://127.0.0.1:9", mattermost_token=Secret("t")))
    listener = await dashboard._listener(configured)
    assert listener["configured"] and listener["running"] and listener["connected"]
    assert listener["reconnects"] == 2
    await runtime.cache.delete(keys.mattermost_listener())
    assert await dashboard._listener(configured) == {
        "configured": True, "running": False, "connected": False}
    assert body["maintenance"] == {"on": False, "reason": None, "expires_in": None}
    # No maxmemory limit on the test instance's ratio would be None; with one, a fraction.
    assert set(body["admission"]) == {"ratio", "closed", "thresholds"}
    assert body["admission"]["closed"] == []


async def test_summary_says_when_maintenance_is_on(
        make_client: Callable[..., Any], runtime: Runtime) -> None:
    client = await _dashboard(make_client, runtime)
    await maintenance.switch_on(runtime.durable, "restoring PostgreSQL", seconds=300)

    async def shown() -> Any:
        body = await (await client.get("/v1/dashboard/summary")).json()
        return body["maintenance"] if body["maintenance"]["on"] else None

    state = await wait_until(shown, timeout=2, message="the banner's data")
    assert state["reason"] == "restoring PostgreSQL" and 0 < state["expires_in"] <= 300


async def test_summary_degrades_when_redis_cache_is_down(
        make_client: Callable[..., Any], runtime: Runtime, servers: Any,
        redis_factory: Callable[..., Any]) -> None:
    from gateway.stores.runtime import open_runtime
    from tests.conftest import make_settings

    cache = redis_factory("cache")
    own = await open_runtime(make_settings(servers, cache_url=cache.url))
    try:
        client = await _dashboard(make_client, own)
        cache.kill()
        await wait_until(lambda: not client.server.app[HUB].signals_up, message="signals down")
        response = await client.get("/v1/dashboard/summary")
        assert response.status == 200
        body = await response.json()
        # Mattermost is not configured here: its card needs no cache and says so.
        assert body["listener"]["configured"] is False and "listener" not in body["errors"]
        # Configured, the listener's section is blanked (its flag lives in redis-cache).
        errors: dict[str, str] = {}
        configured = dataclasses.replace(own, settings=dataclasses.replace(
            own.settings, mattermost_url="http://127.0.0.1:9", mattermost_token=Secret("t")))
        assert await dashboard._part("listener", errors,
                                     dashboard._listener(configured)) is None
        assert "listener" in errors
        assert body["stages"] is not None and body["feed"]["last_offset"] == 0
        assert body["push"]["signals_up"] is False
    finally:
        await own.close()
