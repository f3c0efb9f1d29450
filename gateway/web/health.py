"""``/healthz`` (the process answers), ``/readyz`` (every store answers), ``/metrics``."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from redis.asyncio.cluster import RedisCluster

from gateway.api import routes
from gateway.api.spec import Answer, Operation, boolean, mapping, obj, one_of, string
from gateway.api.state import PUBLIC, READINESS, ReadinessCheck, add_readiness_check
from gateway.leases.maintenance import view_for
from gateway.stores.redis import AnyRedis
from gateway.stores.runtime import Runtime

CHECK_TIMEOUT = 2.0


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _run_check(check: ReadinessCheck) -> tuple[bool, str]:
    try:
        return await asyncio.wait_for(check(), CHECK_TIMEOUT)
    except TimeoutError:
        return False, f"no answer within {CHECK_TIMEOUT:.0f} s"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {str(exc)[:200]}"


async def readyz(request: web.Request) -> web.Response:
    checks = request.app[READINESS]
    results = await asyncio.gather(*(_run_check(check) for check, _ in checks.values()))
    report = {name: {"ok": ok, "detail": detail, "required": checks[name][1]}
              for name, (ok, detail) in zip(checks, results, strict=True)}
    down = [name for name, entry in report.items() if entry["required"] and not entry["ok"]]
    if down:
        body = {"error": "not_ready", "detail": "down: " + ", ".join(down), "checks": report}
        return web.Response(status=503, text=json.dumps(body), content_type="application/json")
    return web.json_response({"status": "ready", "checks": report})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(REGISTRY),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _ping_every_node(client: AnyRedis) -> bool:
    """On a cluster, every primary must answer: one down primary loses a slot range."""
    if isinstance(client, RedisCluster):
        return bool(await client.ping(target_nodes=RedisCluster.PRIMARIES))
    return bool(await client.ping())


def store_checks(runtime: Runtime) -> dict[str, ReadinessCheck]:
    async def durable() -> tuple[bool, str]:
        return await _ping_every_node(runtime.durable), "redis-durable answers"

    async def cache() -> tuple[bool, str]:
        return await _ping_every_node(runtime.cache), "redis-cache answers"

    async def postgres() -> tuple[bool, str]:
        return await runtime.pg.fetchval("SELECT 1", timeout=CHECK_TIMEOUT) == 1, "postgres answers"

    return {"redis-durable": durable, "redis-cache": cache, "postgres": postgres}


def maintenance_check(runtime: Runtime) -> ReadinessCheck:
    """Not ready while maintenance mode is on: load balancers send nothing new here."""
    view = view_for(runtime.durable)

    async def check() -> tuple[bool, str]:
        state = await view.current()
        return (False, f"maintenance: {state.reason}") if state.on else (True, "off")

    return check


CHECKS = mapping(obj({"ok": boolean(), "detail": string(), "required": boolean(
    "a failing required check makes /readyz answer 503")}), "by check name")
HEALTHZ = Operation("The process answers", {200: Answer("alive", obj({"status": one_of("ok")}))},
                    stores=False, tag="health")
READYZ = Operation(
    "Every store answers and maintenance mode is off",
    {200: Answer("ready", obj({"status": one_of("ready"), "checks": CHECKS}))},
    errors={503: "not ready: a required check failed (the body adds checks)"},
    stores=False, tag="health")
METRICS = Operation(
    "Prometheus metrics of this process",
    {200: Answer("the text exposition format", string(), media="text/plain")},
    stores=False, tag="health")


def setup(app: web.Application, runtime: Runtime) -> None:
    for name, check in store_checks(runtime).items():
        add_readiness_check(app, name, check)
    add_readiness_check(app, "maintenance", maintenance_check(runtime))
    routes.get(app, "/healthz", healthz, scope=PUBLIC, doc=HEALTHZ)
    routes.get(app, "/readyz", readyz, scope=PUBLIC, doc=READYZ)
    routes.get(app, "/metrics", metrics,
               scope=PUBLIC if runtime.settings.metrics_public else "metrics:read", doc=METRICS)
