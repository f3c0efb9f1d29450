"""Admin HTTP routes of the pipeline, behind the admin bearer token."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.api import routes
from gateway.api.errors import ApiError
from gateway.api.spec import Answer, Operation, Param, array, integer, mapping, obj, one_of, string
from gateway.api.state import RUNTIME
from gateway.pipeline import deadletter
from gateway.pipeline.stages import STAGES
from gateway.pipeline.status import queue_depths, refresh_depth_gauges
from gateway.security import blocks
from gateway.stores.runtime import Runtime
from gateway.web.usage import USAGE, usage


def _stage(request: web.Request) -> str:
    stage = request.match_info["stage"]
    if stage not in STAGES:
        raise ApiError(404, "not_found", f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    return stage


def _int_param(value: object, name: str, default: int) -> int:
    if value is None:
        return default
    try:
        number = int(str(value))
    except ValueError:
        raise ApiError(400, "bad_request", f"{name} must be an integer") from None
    if not 1 <= number <= deadletter.MAX_BATCH:
        raise ApiError(400, "bad_request", f"{name} must be 1-{deadletter.MAX_BATCH}")
    return number


async def queues(request: web.Request) -> web.Response:
    return web.json_response(await queue_depths(request.app[RUNTIME].durable_reads))


async def dead_letters(request: web.Request) -> web.Response:
    stage = _stage(request)
    limit = _int_param(request.query.get("limit"), "limit", 100)
    items = await deadletter.list_dead(request.app[RUNTIME].durable_reads, stage, limit)
    return web.json_response({"stage": stage, "items": items})


async def requeue(request: web.Request) -> web.Response:
    """Body (optional): ``{"count": n}``; default: up to 1000, oldest first."""
    stage = _stage(request)
    count = deadletter.MAX_BATCH
    if request.can_read_body:
        try:
            body = json.loads(await request.text() or "{}")
        except ValueError:
            raise ApiError(400, "bad_request", "body must be JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "bad_request", "body must be a JSON object")
        count = _int_param(body.get("count"), "count", count)
    ids = await deadletter.requeue(request.app[RUNTIME].durable, stage, count)
    return web.json_response({"stage": stage, "requeued": ids})


async def barrier(request: web.Request) -> web.Response:
    """The addresses the brute-force barrier blocks now, with their remaining seconds."""
    return web.json_response(
        {"blocked": await blocks.list_blocks(request.app[RUNTIME].durable_reads)})


async def barrier_clear(request: web.Request) -> web.Response:
    """``?address=A`` lifts one block (an IPv6 address counts by its /64), ``?all=true``
    every block; answers the addresses that were blocked."""
    address, everything = request.query.get("address"), request.query.get("all")
    if everything not in (None, "true") or (address is None) == (everything is None):
        raise ApiError(400, "bad_request", "give ?address=<address> or ?all=true")
    if address is not None and (not address or len(address) > 64):
        raise ApiError(400, "bad_request", "address must be 1-64 characters")
    cleared = await blocks.clear(request.app[RUNTIME].durable, address)
    return web.json_response({"cleared": cleared})


DEPTH_REFRESH_SECONDS = 5.0


async def _depth_gauges(app: web.Application) -> AsyncIterator[None]:
    """Keep the queue-depth gauges of this process's ``/metrics`` current (workers do the
    same in theirs)."""
    stop = asyncio.Event()

    async def refresh() -> None:
        # Ends on ``stop``, not only on a cancel: a client library may turn a cancel that
        # lands inside a command into an error of its own, which the loop swallows.
        while not stop.is_set():
            with contextlib.suppress(Exception):
                await refresh_depth_gauges(app[RUNTIME].durable)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(DEPTH_REFRESH_SECONDS):
                    await stop.wait()

    task = asyncio.create_task(refresh())
    yield
    stop.set()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


COUNT = integer(minimum=0)
QUEUES = Operation(
    "Queue depths of every pipeline stage",
    {200: Answer("depths", obj({"stages": mapping(obj(
        {"ready": COUNT, "inflight": COUNT, "delayed": COUNT, "dead": COUNT}), "by stage")}))},
    tag="admin")
STAGE = Param("stage", one_of(*STAGES), "a pipeline stage", where="path", required=True)
DEAD_LETTER = obj({"item_id": string(), "stage": string(), "reason": string(),
                   "at": string("when it died, ms since the Unix epoch"),
                   "failures": COUNT, "reclaims": COUNT}, more=True)
DEAD_LETTERS = Operation(
    "A stage's dead letters, oldest first",
    {200: Answer("the dead letters", obj({"stage": string(), "items": array(DEAD_LETTER)}))},
    errors={400: "limit is not a whole number 1-1000", 404: "no such stage"},
    params=(STAGE, Param("limit", integer(minimum=1, maximum=deadletter.MAX_BATCH, default=100),
                         "how many")),
    tag="admin")
REQUEUE = Operation(
    "Put a stage's dead letters back into it, oldest first",
    {200: Answer("the item ids requeued", obj({"stage": string(),
                                               "requeued": array(string())}))},
    errors={400: "the body is not a JSON object, or count is not a whole number 1-1000",
            404: "no such stage"},
    body=obj(optional={"count": integer(minimum=1, maximum=deadletter.MAX_BATCH,
                                        default=deadletter.MAX_BATCH)}),
    body_required=False, params=(STAGE,), tag="admin")

BARRIER = Operation(
    "Addresses the brute-force barrier blocks now",
    {200: Answer("the blocks, longest first", obj({"blocked": array(obj({
        "address": string("an IPv4 address, or an IPv6 /64"),
        "expires_in": integer("seconds the block still lasts", minimum=1)}))}))},
    tag="admin")
BARRIER_CLEAR = Operation(
    "Lift one address's block, or every block",
    {200: Answer("the addresses that were blocked",
                 obj({"cleared": array(string("an IPv4 address, or an IPv6 /64"))}))},
    errors={400: "neither or both of address and all, or an empty address"},
    params=(Param("address", string("an address (IPv6: any address of the /64)",
                                    minLength=1, maxLength=64), "the address to lift"),
            Param("all", one_of("true"), "lift every block")),
    tag="admin")


def setup(app: web.Application, runtime: Runtime) -> None:
    app.cleanup_ctx.append(_depth_gauges)
    routes.get(app, "/v1/admin/queues", queues, scope="admin", doc=QUEUES)
    routes.get(app, "/v1/admin/deadletter/{stage}", dead_letters, scope="admin",
               doc=DEAD_LETTERS)
    routes.post(app, "/v1/admin/deadletter/{stage}/requeue", requeue, scope="admin",
                doc=REQUEUE)
    routes.get(app, "/v1/admin/usage", usage, scope="admin", doc=USAGE)
    routes.get(app, "/v1/admin/barrier", barrier, scope="admin", doc=BARRIER)
    routes.add(app, "DELETE", "/v1/admin/barrier", barrier_clear, scope="admin",
               doc=BARRIER_CLEAR)
