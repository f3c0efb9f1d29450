"""``POST /v1/topics/{topic}/events`` (scope ``events:write``): publish an event of one's own.

The credential's topic patterns must cover the topic; the gateway's own topics (``pipeline``,
``conversation:*``, ``webhook:*``, ``docs:*``) are refused to everyone. The body (at most
64 KiB) is ``{"kind"?, "text"?, "data"?, "event_id"?}``; the answer is ``202 {"status":
"accepted", "topic", "offset"}``, or ``200 {"status": "duplicate", ...}`` with the first
one's offset for an ``event_id`` seen on the topic within ``GATEWAY_DEDUP_TTL``. Publishing
is limited per credential (``[notifications] events_per_minute``, 600; the admin token is
not), like job submission.
"""

from __future__ import annotations

from aiohttp import web

from gateway.api import routes
from gateway.api.errors import ApiError
from gateway.api.spec import Answer, Operation, Param, integer, obj, one_of, string
from gateway.api.state import principal_of
from gateway.inbound.documents import parse_json
from gateway.inbound.http_intake import install as install_inbound
from gateway.inbound.http_intake import read_body, require_json
from gateway.inbound.signing import MalformedError
from gateway.notifications import publish
from gateway.notifications.settings import NotificationSettings
from gateway.push.protocol import TOPIC_RE, FeedError
from gateway.ratelimit import Limiter
from gateway.ratelimit.credential import CredentialRate
from gateway.stores.runtime import Runtime


class Publisher:
    def __init__(self, app: web.Application, runtime: Runtime) -> None:
        self.runtime = runtime
        self.rate = CredentialRate(
            Limiter(runtime.durable, install_inbound(app, runtime).auto), "events",
            NotificationSettings.from_settings(runtime.settings).events_per_minute, 60,
            "events a minute for this credential")

    async def post(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        principal = principal_of(request)
        if publish.reserved(topic):
            raise ApiError(403, "forbidden", f"{topic[:200]!r} is one of the gateway's own "
                           f"topics ({', '.join(publish.RESERVED)}): not for publishing")
        if not principal.may_read(topic):
            raise ApiError(403, "forbidden", "the credential's topics do not cover "
                           f"{topic[:200]!r}")
        require_json(request)
        body = await read_body(request)
        if len(body) > publish.MAX_EVENT_BYTES:
            raise ApiError(413, "payload_too_large", f"an event is at most "
                           f"{publish.MAX_EVENT_BYTES} bytes (got {len(body)})")
        try:
            event = publish.parse_event(parse_json(body))
        except (MalformedError, ValueError) as exc:  # FeedError; a number past 4,300 digits
            raise ApiError(400, "bad_request", str(exc)) from None
        if not principal.is_admin:
            await self.rate.admit(principal.owner)
        try:
            published = await publish.publish(self.runtime.pg, self.runtime.cache, topic,
                                              event, self.runtime.settings.dedup_ttl)
        except FeedError as exc:
            raise ApiError(400, "bad_request", str(exc)) from None
        return web.json_response(
            {"status": "duplicate" if published.duplicate else "accepted", "topic": topic,
             "offset": published.offset}, status=200 if published.duplicate else 202)


def _answer(status: str, meaning: str) -> Answer:
    return Answer(meaning, obj({"status": one_of(status), "topic": string(),
                                "offset": integer("the event's offset in the topic's feed",
                                                  minimum=1)}))


PUBLISH = Operation(
    "Publish an event of one's own on a topic (a feed row, pushed to its streams)",
    {202: _answer("accepted", "published"),
     200: _answer("duplicate", "this event_id was published on the topic before: its offset")},
    errors={400: "the body is not a valid event, or the topic is not a topic",
            403: "one of the gateway's own topics, or a topic the credential's patterns do "
                 "not cover",
            413: f"the body is over {publish.MAX_EVENT_BYTES} bytes",
            415: "the body is not declared application/json",
            429: "over [notifications] events_per_minute for this credential"},
    body=obj(optional={
        "kind": string("the event's name (its SSE event name)"), "text": string(),
        "data": obj(more=True),
        "event_id": string("makes the POST idempotent on the topic", minLength=1,
                           pattern="^[!-~]+$")}),
    params=(Param("topic", string(pattern=TOPIC_RE.pattern), "the topic",
                  where="path", required=True),),
    tag="feed")


def setup(app: web.Application, runtime: Runtime) -> None:
    publisher = Publisher(app, runtime)
    routes.post(app, "/v1/topics/{topic}/events", publisher.post, scope="events:write",
                doc=PUBLISH)
