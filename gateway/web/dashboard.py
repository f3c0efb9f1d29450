"""``GET /``: the live dashboard (one static page, no build step), and
``GET /v1/dashboard/summary``: the read-only JSON it refreshes from.

The page follows ``/v1/stream?topics=pipeline`` with the small JS push client
(``static/push.js``) for the live feed, and re-reads the summary when a row arrives (at
most once a second) and every few seconds otherwise. The summary holds counts and health
only: no payloads beyond the feed's own, no configuration, no secrets.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.api import routes
from gateway.api.spec import Answer, Operation, array, integer, mapping, nullable, obj, string
from gateway.api.state import PUBLIC, RUNTIME
from gateway.inbound.http_intake import INBOUND
from gateway.inbound.mattermost import health as mattermost_health
from gateway.leases.maintenance import view_for
from gateway.notifications import store as subscriptions
from gateway.pipeline.status import queue_depths
from gateway.providers.usage import start_of_day, usage_report
from gateway.push import feed
from gateway.push.web import HUB
from gateway.stores.runtime import Runtime

log = logging.getLogger("gateway.web")
STATIC = Path(__file__).parent / "static"
THROUGHPUT_WINDOW_SECONDS = 60
SERIES_MINUTES = 15  # the throughput chart: completions per minute, the current one last
PIPELINE_TOPIC = "pipeline"

_THROUGHPUT = """
SELECT kind, count(*) AS n FROM feed
WHERE topic = $1 AND created_at > clock_timestamp() - make_interval(secs => $2)
GROUP BY kind
"""


_SERIES = """
SELECT floor(extract(epoch FROM created_at) / 60)::bigint AS minute, count(*) AS n FROM feed
WHERE topic = $1 AND created_at >= to_timestamp($2::bigint * 60)
GROUP BY 1
"""
_NOW_MINUTE = "SELECT floor(extract(epoch FROM clock_timestamp()) / 60)::bigint"


class MinuteSeries:
    """Stage completions per minute over the last ``SERIES_MINUTES`` (the chart).

    A minute that has ended is counted once and remembered by this process; each summary
    counts only the minutes it has not seen end (the current one, as a rule), so the chart
    costs about what the last minute's figures cost, not a count of a quarter hour of rows
    every few seconds."""

    def __init__(self) -> None:
        self.ended: dict[int, int] = {}

    async def read(self, pg: Any) -> list[dict[str, Any]]:
        now = int(await pg.fetchval(_NOW_MINUTE))
        first = now - SERIES_MINUTES + 1
        self.ended = {m: n for m, n in self.ended.items() if m >= first}
        since = next((m for m in range(first, now) if m not in self.ended), now)
        counts = {int(r["minute"]): int(r["n"])
                  for r in await pg.fetch(_SERIES, PIPELINE_TOPIC, since)}
        for minute in range(since, now):
            self.ended[minute] = counts.get(minute, 0)
        return [{"minute": datetime.fromtimestamp(m * 60, UTC).isoformat(),
                 "completions": self.ended[m] if m < now else counts.get(m, 0)}
                for m in range(first, now + 1)]


SERIES: web.AppKey[MinuteSeries] = web.AppKey("dashboard_series", MinuteSeries)


async def _part(name: str, errors: dict[str, str], coro: Any) -> Any:
    """One section of the summary; a store that is down blanks its section only."""
    try:
        return await coro
    except Exception as exc:
        log.info("dashboard: %s unavailable: %s", name, type(exc).__name__)
        errors[name] = f"unavailable ({type(exc).__name__})"
        return None


async def _throughput(runtime: Runtime, series: MinuteSeries) -> dict[str, Any]:
    rows = await runtime.pg_reads.fetch(_THROUGHPUT, PIPELINE_TOPIC,
                                        float(THROUGHPUT_WINDOW_SECONDS))
    per_stage = {r["kind"]: r["n"] for r in rows}
    return {"window_seconds": THROUGHPUT_WINDOW_SECONDS, "completions": per_stage,
            "per_second": round(sum(per_stage.values()) / THROUGHPUT_WINDOW_SECONDS, 3),
            "series": await series.read(runtime.pg_reads)}


async def _listener(runtime: Runtime) -> dict[str, Any]:
    """The Mattermost listener's health flag; ``configured`` false (and nothing read) where
    ``MATTERMOST_URL`` is not set: nothing is wrong then, there is simply no listener."""
    if not runtime.settings.mattermost_url:
        return {"configured": False, "running": False, "connected": False}
    flag = await mattermost_health.read(runtime.cache)
    if flag is None:
        return {"configured": True, "running": False, "connected": False}
    return {"configured": True, "running": True, "connected": bool(flag.get("connected")),
            "instance": flag.get("instance"), "since": flag.get("since"),
            "last_event_at": flag.get("last_event_at"), "reconnects": flag.get("reconnects")}


async def summary(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    errors: dict[str, str] = {}
    queues = await _part("queues", errors, queue_depths(runtime.durable_reads))
    throughput = await _part("throughput", errors, _throughput(runtime, request.app[SERIES]))
    listener = await _part("listener", errors, _listener(runtime))
    heads = await _part("feed", errors, feed.heads(runtime.pg_reads, [PIPELINE_TOPIC]))
    maintenance = await _part("maintenance", errors, view_for(runtime.durable).current())
    admission = await _part("admission", errors, request.app[INBOUND].admission.state())
    usage = await _part("usage", errors, usage_report(runtime.pg, "provider", start_of_day()))
    notifications = await _part("notifications", errors,
                                subscriptions.summary(runtime.pg_reads))
    stages = (queues or {}).get("stages")
    hub = request.app[HUB]
    return web.json_response({
        "generated_at": datetime.now(UTC).isoformat(),
        "stages": stages,
        "dead_letters": sum(s["dead"] for s in stages.values()) if stages else None,
        "throughput": throughput,
        "listener": listener,
        "feed": ({"topic": PIPELINE_TOPIC, "epoch": heads[PIPELINE_TOPIC].epoch,
                  "last_offset": heads[PIPELINE_TOPIC].last_offset} if heads else None),
        "push": {"signals_up": hub.signals_up, "streams": hub.subscriber_count},
        "maintenance": maintenance.to_json() if maintenance else None,
        "admission": admission,
        "usage": usage,  # model provider calls today, by provider
        "notifications": notifications,  # subscriptions by state, lag, the furthest behind
        "errors": errors,
    })


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "dashboard.html",
                            headers={"Cache-Control": "no-cache"})


SECTION = nullable(obj(more=True))  # a section is null while its store is unavailable
SUMMARY = Operation(
    "What the dashboard shows: queues, throughput, listener, feed, push, maintenance, "
    "admission, today's provider usage and the notification subscriptions",
    {200: Answer("the summary", obj({
        "generated_at": string(format="date-time"),
        "stages": nullable(mapping(obj(more=True), "queue depths by stage")),
        "dead_letters": nullable(integer(minimum=0)),
        "throughput": SECTION, "listener": SECTION, "feed": SECTION,
        "push": obj(more=True), "maintenance": SECTION, "admission": SECTION,
        "usage": nullable(array(obj(more=True))),
        "notifications": SECTION,
        "errors": mapping(string(), "sections left empty, and why")}, more=True))},
    tag="dashboard")
PAGE = Operation(
    "The live dashboard page (it asks for an admin credential itself)",
    {200: Answer("the page", string(), media="text/html")}, stores=False, tag="dashboard")


def setup(app: web.Application, runtime: Runtime) -> None:
    app[SERIES] = MinuteSeries()
    routes.get(app, "/", index, scope=PUBLIC, doc=PAGE)
    routes.get(app, "/v1/dashboard/summary", summary, scope="admin", doc=SUMMARY)
    routes.static(app, "/static/", STATIC, tag="dashboard")
