"""HTTP component: ``GET /v1/feed`` (polling) and ``GET /v1/stream`` (SSE), plus the hub,
the retention task and the sweep of pending feed rows that live as long as the application."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any

from aiohttp import web

from gateway.api import routes
from gateway.api.errors import ApiError
from gateway.api.spec import Answer, Operation, Param, array, integer, obj, string
from gateway.api.state import (
    CLIENT_ADDRESS,
    STILL_VALID,
    TOPIC_GRANT,
    add_readiness_check,
    principal_of,
)
from gateway.push import feed, sse
from gateway.push.hub import Hub, Subscriber
from gateway.push.protocol import MAX_CURSOR_CHARS, MAX_OFFSET, TOPIC_RE, FeedError
from gateway.push.retention import run_retention
from gateway.push.sequencer import Sequencer
from gateway.push.settings import PushSettings
from gateway.stores.runtime import Runtime

HUB: web.AppKey[Hub] = web.AppKey("push_hub", Hub)
DEFAULT_LIMIT = 100


def _int_param(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ApiError(400, "bad_request",
                       f"{name} must be an integer (got {raw[:40]!r})") from None


async def require_topics(request: web.Request, topics: tuple[str, ...] | list[str]) -> None:
    """403 naming every topic the credential may not read (by its patterns, or by a chat
    linked to its account): a request naming any is refused whole."""
    principal = principal_of(request)
    forbidden = [topic for topic in topics if not principal.may_read(topic)]
    grant = request.app.get(TOPIC_GRANT)
    if forbidden and grant is not None:
        granted = await grant(principal, forbidden)
        forbidden = [topic for topic in forbidden if topic not in granted]
    if forbidden:
        raise ApiError(403, "forbidden", "the credential may not read topic(s): "
                       + ", ".join(t[:100] for t in forbidden[:10]))


WATCH_SECONDS = 2.0  # a revoked credential's stream ends within this (plus the 1 s cache)


Watch = Callable[[Subscriber], Coroutine[Any, Any, None]]


def watch_credential(request: web.Request) -> Watch | None:
    """For a stream opened with an access token or an API key: end it when the token expires
    (``token_expired``), when the token or the key is revoked (``revoked``), so the client
    refreshes and resumes, and when a chat link it reads a topic through is removed
    (``forbidden``: reconnecting without that topic is the client's call)."""
    principal = principal_of(request)
    still_valid = request.app.get(STILL_VALID)
    if principal.is_admin or still_valid is None:
        return None
    valid, grant = still_valid, request.app.get(TOPIC_GRANT)
    expires_at = principal.expires_at

    async def watch(sub: Subscriber) -> None:
        linked = [t for t in sub.topics if not principal.may_read(t)] if grant else []
        while True:
            left = WATCH_SECONDS if expires_at is None else expires_at - time.time()
            await asyncio.sleep(max(0.0, min(WATCH_SECONDS, left)))
            if expires_at is not None and time.time() >= expires_at:
                sub.close("token_expired: the access token expired; refresh it and reconnect"
                          " with Last-Event-ID")
                return
            with contextlib.suppress(Exception):  # a store blip: look again next time
                if not await valid(principal):
                    sub.close("revoked: the credential was revoked")
                    return
                if linked and grant is not None:
                    lost = set(linked) - await grant(principal, linked)
                    if lost:
                        sub.close("forbidden: a chat link this stream read through was removed"
                                  f" ({', '.join(sorted(lost))[:200]})")
                        return

    return watch


class StreamCaps:
    """Bounded streams: per client address (429) and per process (503), both with
    ``Retry-After``, so idle streams cannot exhaust the process's file descriptors."""

    def __init__(self, config: PushSettings) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.total = config.max_streams or max(16, soft // 2)
        self.per_client = config.max_streams_per_client
        self.open: dict[str, int] = {}
        self.count = 0

    @contextlib.contextmanager
    def admit(self, request: web.Request) -> Iterator[None]:
        address_of = request.app.get(CLIENT_ADDRESS)
        client = (address_of(request) if address_of else "") or request.remote or "unknown"
        if self.count >= self.total:
            raise ApiError(503, "busy", f"this server holds {self.total} streams already",
                           {"Retry-After": "5"})
        if self.open.get(client, 0) >= self.per_client:
            raise ApiError(429, "rate_limited", f"at most {self.per_client} streams per client",
                           {"Retry-After": "5"})
        self.count += 1
        self.open[client] = self.open.get(client, 0) + 1
        try:
            yield
        finally:
            self.count -= 1
            left = self.open[client] - 1
            if left:
                self.open[client] = left
            else:
                del self.open[client]


def make_feed_handler(runtime: Runtime) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def get_feed(request: web.Request) -> web.Response:
        topic = request.query.get("topic")
        if not topic:
            raise ApiError(400, "bad_request", "topic is required, e.g. ?topic=pipeline")
        await require_topics(request, [topic])
        after = _int_param(request, "after", 0)
        limit = _int_param(request, "limit", DEFAULT_LIMIT)
        try:
            page = await feed.read_page(runtime.pg_reads, topic, after, limit)
        except FeedError as exc:
            raise ApiError(400, "bad_request", str(exc)) from None
        return web.json_response({
            "topic": page.topic, "epoch": page.epoch,
            "rows": [row.to_json() for row in page.rows],
            # Extensions: the newest offset, and the last offset retention removed (a
            # reader with after < trimmed_through has lost rows after..trimmed_through).
            "last_offset": page.last_offset, "trimmed_through": page.trimmed_through,
        })

    return get_feed


TOPIC = string("a topic, e.g. pipeline or conversation:<id>", pattern=TOPIC_RE.pattern,
               examples=["pipeline"])
_ONE = TOPIC_RE.pattern.strip("^$")
TOPICS = string("comma-separated topics", pattern=f"^{_ONE}(,{_ONE})*$", examples=["pipeline"])
OFFSET = integer(minimum=0, maximum=MAX_OFFSET)
ROW = obj({"topic": string(), "offset": OFFSET, "epoch": integer(), "kind": string(),
           "payload": obj(more=True), "created_at": string(format="date-time")})
FEED = Operation(
    "A page of a topic's feed rows after an offset, oldest first",
    {200: Answer("the page", obj({
        "topic": string(), "epoch": integer(), "rows": array(ROW), "last_offset": OFFSET,
        "trimmed_through": integer("rows up to here were removed by retention",
                                   minimum=0)}))},
    errors={400: "topic is missing or not a topic, or after or limit is out of range",
            403: "the credential may not read this topic"},
    params=(Param("topic", TOPIC, "the topic", required=True),
            Param("after", integer(minimum=0, default=0), "rows after this offset"),
            Param("limit", integer(minimum=1, maximum=feed.MAX_READ_LIMIT,
                                   default=DEFAULT_LIMIT), "how many rows at most")),
    tag="feed")
_POSITION = f"{_ONE}:[0-9]{{1,19}}"
CURSOR = string("<topic>:<offset>,... as the last event's id", maxLength=MAX_CURSOR_CHARS,
                pattern=f"^({_POSITION}(,{_POSITION})*)?$", examples=["pipeline:0"])
STREAM = Operation(
    "Server-sent events of topics' new rows, resuming after a cursor",
    {200: Answer("an event stream (the schema is one event's): one event per row, named by its "
                 "kind, with the row as data and the stream's cursor as id; comments as "
                 "heartbeats; gateway.disconnect before the server ends it",
                 obj(optional={"event": string("the row's kind, or gateway.disconnect"),
                               "data": string("the row as JSON (as /v1/feed gives it), or "
                                              "the reason of a disconnect"),
                               "id": string("the cursor to resume from (Last-Event-ID)"),
                               "retry": integer(minimum=0)}),
                 media="text/event-stream")},
    errors={400: "topics is missing or names a bad topic or too many, or the cursor is bad",
            403: "the credential may not read a topic named",
            429: "this client address holds [push] max_streams_per_client streams",
            503: "this process holds its most streams"},
    params=(Param("topics", TOPICS, "the topics",
                  required=True),
            Param("since", CURSOR, "resume after these offsets (as Last-Event-ID)"),
            Param("Last-Event-ID", CURSOR, "resume after this event", where="header")),
    tag="feed")


def setup(app: web.Application, runtime: Runtime) -> None:
    config = PushSettings.from_settings(runtime.settings)
    hub = Hub(runtime.pg, runtime.cache, config)
    app[HUB] = hub

    async def background(app: web.Application) -> AsyncIterator[None]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(hub.run(stop)),
                 asyncio.create_task(run_retention(runtime.pg, config, stop)),
                 # Rows a dead worker left without offsets, even when no worker is left.
                 asyncio.create_task(Sequencer(runtime.pg, runtime.cache).run_sweeper(stop))]
        yield
        stop.set()
        for task in tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 10)

    async def on_shutdown(app: web.Application) -> None:
        hub.close_all("shutdown: the server is stopping; reconnect with Last-Event-ID")

    caps = StreamCaps(config)

    async def stream(request: web.Request) -> web.StreamResponse:
        await require_topics(request, sse.parse_topics(request.query.get("topics"),
                                                       config.max_topics_per_stream))
        with caps.admit(request):
            return await sse.stream(request, hub, runtime.pg, config,
                                    watch_credential(request))

    async def signals() -> tuple[bool, str]:
        if hub.signals_up:
            return True, f"push signals live; {hub.subscriber_count} stream(s)"
        return False, "push signals down: streams poll the feed"

    app.cleanup_ctx.append(background)
    app.on_shutdown.append(on_shutdown)
    add_readiness_check(app, "push-signals", signals, required=False)
    routes.get(app, "/v1/feed", make_feed_handler(runtime), scope="feed:read", doc=FEED)
    routes.get(app, "/v1/stream", stream, scope="feed:read", query_token=True, doc=STREAM)
