"""``/v1/subscriptions`` (scope ``subscriptions:write``) and ``GET /v1/admin/subscriptions``.

A credential subscribes only to topic patterns its own topics cover, and sees and changes
only its own subscriptions (an API key's, or an account's whatever token it uses); the admin
token sees and changes all. A webhook destination's secret is shown once, in the answer that
creates it. ``GET /v1/admin/subscriptions`` adds each one's lag (rows behind).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.access.principal import Principal
from gateway.api import routes
from gateway.api.errors import ApiError
from gateway.api.spec import (
    Answer,
    Operation,
    Param,
    array,
    integer,
    mapping,
    nullable,
    obj,
    one_of,
    string,
)
from gateway.api.state import principal_of
from gateway.conversations import links
from gateway.inbound.documents import parse_json
from gateway.inbound.http_intake import read_body, require_json
from gateway.inbound.signing import MalformedError
from gateway.notifications import store
from gateway.notifications.engine import policy_of
from gateway.notifications.settings import NotificationSettings
from gateway.notifications.subscriptions import (
    CHAT_FIELDS,
    CHAT_TYPES,
    Invalid,
    parse_request,
)
from gateway.outbound.safe_http import Refused, SafeClient
from gateway.stores.runtime import Runtime

ADMIN_OWNER = "admin"
DEFAULT_LIMIT = 100
MAX_ID = 100


def _principal(request: web.Request) -> Principal:
    principal = principal_of(request)
    assert isinstance(principal, Principal)
    return principal


def _owner(request: web.Request) -> str | None:
    """Whose subscriptions the request may see: None (all) for the admin."""
    principal = _principal(request)
    return None if principal.is_admin else principal.owner


def _id(request: web.Request) -> str:
    sub_id = request.match_info["id"]
    if not 1 <= len(sub_id) <= MAX_ID or not sub_id.isprintable():
        raise ApiError(404, "not_found", "no such subscription")
    return sub_id


async def _body(request: web.Request) -> Any:
    require_json(request)
    try:
        return parse_json(await read_body(request))
    except (MalformedError, ValueError) as exc:
        raise ApiError(400, "bad_request", str(exc)) from None


def _int(request: web.Request, name: str, default: int, high: int) -> int:
    raw = request.query.get(name, "")
    if not raw:
        return default
    if not raw.isascii() or not raw.isdigit() or not 0 <= int(raw) <= high:
        raise ApiError(400, "bad_request", f"{name} must be an integer 0-{high}")
    return int(raw)


class SubscriptionRoutes:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.settings = NotificationSettings.from_settings(runtime.settings)
        # Where an endpoint points is checked now, and again on every connection.
        self.client = SafeClient(policy_of(self.settings))

    async def create(self, request: web.Request) -> web.Response:
        principal = _principal(request)
        try:
            parsed = parse_request(await _body(request), allow_http=self.settings.allow_http)
        except Invalid as exc:
            raise ApiError(400, "bad_request", str(exc)) from None
        if not principal.reads_all(parsed.topic):
            raise ApiError(403, "forbidden", "the credential's topics do not cover "
                           f"{parsed.topic[:200]!r}")
        if parsed.destination["type"] == "webhook":
            try:
                await self.client.check_url(parsed.destination["url"])
            except Refused as exc:
                raise ApiError(400, "bad_request", f"destination.url: {exc}") from None
        if parsed.destination["type"] in CHAT_TYPES and not await self._linked(
                principal, parsed.destination):
            raise ApiError(403, "forbidden", "a chat destination must be a chat linked to the "
                           "credential's account (/link), else use the admin token or "
                           "/subscribe <topic> in the chat")
        limit = None if principal.is_admin else self.settings.max_subscriptions_per_credential
        try:
            created, secret = await store.create(
                self.runtime.pg, self.runtime.cache, principal.owner or ADMIN_OWNER, parsed,
                limit)
        except store.TooMany as exc:
            raise ApiError(409, "too_many_subscriptions", str(exc)) from None
        if secret is not None:
            created["secret"] = secret  # shown this once
        return web.json_response(created, status=201)

    async def _linked(self, principal: Principal, destination: dict[str, Any]) -> bool:
        """May ``principal`` make the bot post in this chat? The admin anywhere; an account
        in a chat linked to it (an API key has no chats)."""
        if principal.is_admin:
            return True
        kind = str(destination["type"])
        return principal.account is not None and await links.linked_chat(
            self.runtime.pg, principal.account, kind, str(destination[CHAT_FIELDS[kind]]))

    async def listing(self, request: web.Request) -> web.Response:
        found = await store.listing(self.runtime.pg_reads, _owner(request),
                                    _int(request, "limit", DEFAULT_LIMIT, store.MAX_LIST) or 1,
                                    request.query.get("after") or None)
        return web.json_response({"subscriptions": found})

    async def admin_listing(self, request: web.Request) -> web.Response:
        found = await store.listing(self.runtime.pg_reads, None,
                                    _int(request, "limit", DEFAULT_LIMIT, store.MAX_LIST) or 1,
                                    request.query.get("after") or None, lag=True)
        return web.json_response({"subscriptions": found})

    async def get(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(await store.get(self.runtime.pg_reads, _id(request),
                                                     _owner(request)))
        except store.NotFound:
            raise ApiError(404, "not_found", "no such subscription") from None

    async def delete(self, request: web.Request) -> web.Response:
        try:
            await store.delete(self.runtime.pg, self.runtime.cache, _id(request),
                               _owner(request))
        except store.NotFound:
            raise ApiError(404, "not_found", "no such subscription") from None
        return web.json_response({"status": "deleted"})

    async def pause(self, request: web.Request) -> web.Response:
        return await self._state(request, "paused")

    async def resume(self, request: web.Request) -> web.Response:
        return await self._state(request, "active")

    async def _state(self, request: web.Request, state: str) -> web.Response:
        try:
            return web.json_response(await store.set_state(
                self.runtime.pg, self.runtime.cache, _id(request), _owner(request), state))
        except store.NotFound:
            raise ApiError(404, "not_found", "no such subscription") from None

    async def replay(self, request: web.Request) -> web.Response:
        body = await _body(request)
        after = body.get("after") if isinstance(body, dict) else None
        if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after < 2**63:
            raise ApiError(400, "bad_request", 'body must be {"after": <offset >= 0>}')
        try:
            return web.json_response(await store.replay(
                self.runtime.pg, self.runtime.cache, _id(request), _owner(request), after))
        except store.NotFound:
            raise ApiError(404, "not_found", "no such subscription") from None

    async def failures(self, request: web.Request) -> web.Response:
        try:
            found = await store.failures(
                self.runtime.pg_reads, _id(request), _owner(request),
                _int(request, "limit", DEFAULT_LIMIT, store.MAX_LIST) or 1,
                _int(request, "after", 0, 2**63 - 1))
        except store.NotFound:
            raise ApiError(404, "not_found", "no such subscription") from None
        return web.json_response({"failures": found})


_DESTINATION = {"oneOf": [
    obj({"type": one_of("webhook"), "url": string("https:// (http:// with [notifications] "
                                                  "allow_http)", maxLength=2048)},
        {"secret": string("whsec_<base64>; made when left out, shown once")}),
    obj({"type": one_of("telegram"), "chat_id": {"type": ["string", "integer"]}}),
    obj({"type": one_of("slack"), "channel": string()}),
    obj({"type": one_of("mattermost"), "channel_id": string()})]}
_SHOWN_DESTINATION = {"type": "object", "description": "the destination, never its secret"}
_SUBSCRIPTION = obj({
    "id": string(), "topic": string("a topic, or a prefix ending in *"),
    "kinds": nullable(array(string())), "destination": _SHOWN_DESTINATION,
    "template": nullable(string()), "state": one_of("active", "paused"),
    "cursor": mapping(integer(minimum=0), "per topic, the last offset delivered"),
    "last_error": nullable(string()), "failing_since": nullable(string()),
    "delivered_at": nullable(string()), "created_at": string(), "owner": string()},
    {"secret": string("the webhook secret: only in the answer that creates it"),
     "lag": integer("rows behind (admin listing)", minimum=0)})
_ONE = {200: Answer("the subscription", _SUBSCRIPTION)}
_LIST = {200: Answer("subscriptions, oldest first",
                     obj({"subscriptions": array(_SUBSCRIPTION)}))}
_ID = (Param("id", string(), "the subscription's id", where="path", required=True),)
_PAGE = (Param("limit", integer(minimum=0, maximum=store.MAX_LIST), "at most this many (100)"),
         Param("after", string(), "the last id of the previous page"))
_NOT_FOUND = {404: "no subscription of this credential has this id"}
TAG = "subscriptions"
CREATE = Operation(
    "Subscribe an HTTP endpoint (or, with the admin token, a chat) to a topic",
    {201: Answer("the subscription, with a webhook's secret this once", _SUBSCRIPTION)},
    errors={400: "not a valid subscription", 403: "a topic the credential's patterns do "
            "not cover, or a chat destination without the admin token",
            409: "the credential holds max_subscriptions_per_credential already",
            415: "the body is not declared application/json"},
    body=obj({"topic": string("a topic, or a prefix ending in *"),
              "destination": _DESTINATION},
             {"kinds": array(string(), minItems=1, maxItems=50),
              "template": string("chats: {topic} {kind} {offset} {text} {data.<name>}"),
              "after": integer("start after this offset (default: the topic's end)",
                               minimum=0)}), tag=TAG)
LIST = Operation("The credential's subscriptions (the admin's: all)", _LIST, params=_PAGE,
                 errors={400: "a bad limit"}, tag=TAG)
ADMIN_LIST = Operation("Every subscription with its state and lag", _LIST, params=_PAGE,
                       errors={400: "a bad limit"}, tag=TAG)
GET = Operation("One subscription", _ONE, errors=_NOT_FOUND, params=_ID, tag=TAG)
DELETE = Operation("Remove a subscription", {200: Answer("removed", obj(
    {"status": one_of("deleted")}))}, errors=_NOT_FOUND, params=_ID, tag=TAG)
PAUSE = Operation("Pause a subscription (its rows wait)", _ONE, errors=_NOT_FOUND,
                  params=_ID, body_required=False, tag=TAG)
RESUME = Operation("Resume a subscription (its last error forgotten, tried at once)", _ONE,
                   errors=_NOT_FOUND, params=_ID, body_required=False, tag=TAG)
REPLAY = Operation("Deliver again from offset after + 1", _ONE,
                   errors={**_NOT_FOUND, 400: "after is not an offset",
                           415: "the body is not declared application/json"}, params=_ID,
                   body=obj({"after": integer(minimum=0)}), tag=TAG)
FAILURES = Operation(
    "The rows given up on after the retry schedule", {200: Answer("oldest first", obj({
        "failures": array(obj({
            "id": integer(), "topic": string(), "offset": integer(), "kind": string(),
            "attempts": integer(), "error": string(), "first_failed_at": string(),
            "failed_at": string()}))}))},
    errors={**_NOT_FOUND, 400: "a bad limit or after"},
    params=(*_ID, Param("limit", integer(minimum=0, maximum=store.MAX_LIST), "at most"),
            Param("after", integer(minimum=0), "the last failure id of the previous page")),
    tag=TAG)


def setup(app: web.Application, runtime: Runtime) -> None:
    r = SubscriptionRoutes(runtime)
    scope = "subscriptions:write"
    routes.post(app, "/v1/subscriptions", r.create, scope=scope, doc=CREATE)
    routes.get(app, "/v1/subscriptions", r.listing, scope=scope, doc=LIST)
    routes.get(app, "/v1/subscriptions/{id}", r.get, scope=scope, doc=GET)
    routes.add(app, "DELETE", "/v1/subscriptions/{id}", r.delete, scope=scope, doc=DELETE)
    routes.post(app, "/v1/subscriptions/{id}/pause", r.pause, scope=scope, doc=PAUSE)
    routes.post(app, "/v1/subscriptions/{id}/resume", r.resume, scope=scope, doc=RESUME)
    routes.post(app, "/v1/subscriptions/{id}/replay", r.replay, scope=scope, doc=REPLAY)
    routes.get(app, "/v1/subscriptions/{id}/failures", r.failures, scope=scope,
               doc=FAILURES)
    routes.get(app, "/v1/admin/subscriptions", r.admin_listing, scope="admin",
               doc=ADMIN_LIST)
