"""Fake Slack Web API plus helpers to build and sign inbound Slack requests.

``FakeSlack`` serves ``/api/<method>`` (what slack_sdk's ``AsyncWebClient``
calls) and ``/response/<id>`` (slash-command ``response_url``) on 127.0.0.1,
recording calls and injecting failures, so Slack code is tested offline with
the real slack_sdk / slack_bolt.  Pass ``fake.api_url`` (it ends in ``/``,
which slack_sdk's ``urljoin`` needs) as ``SLACK_API_URL``.

The module-level builders make the bodies Slack would POST to the gateway
(``event_callback``, ``url_verification``, slash commands) and sign them the
way Slack does (``v0=`` HMAC-SHA256 over ``v0:{ts}:{body}``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from slack_sdk.signature import SignatureVerifier

from tests.fakes.base import FakeServer, Fault, json_response, read_params

__all__ = [
    "BOT_ID",
    "BOT_USER_ID",
    "TEAM_ID",
    "FakeSlack",
    "app_mention_event",
    "event_callback",
    "message_event",
    "sign_slack",
    "signed_form",
    "signed_json",
    "slash_command_body",
    "url_verification",
]

TEAM_ID = "T0FAKE"
BOT_USER_ID = "U0BOT"
BOT_ID = "B0BOT"
APP_ID = "A0FAKE"
USER_ID = "U0USER"
CHANNEL_ID = "C0CHAN"

MAX_TEXT = 40_000  # characters: longer texts are refused with msg_too_long

_ts_counter = itertools.count(1)
_event_counter = itertools.count(1)


def _new_ts() -> str:
    """Unique, increasing Slack-style message timestamp ``<seconds>.<6 digits>``."""
    return f"{int(time.time())}.{next(_ts_counter) % 1_000_000:06d}"


# --- signing and inbound request builders -----------------------------------------


def sign_slack(
    secret: str, body: bytes | str, timestamp: int | str | None = None
) -> dict[str, str]:
    """Headers Slack adds to a request: ``X-Slack-Request-Timestamp`` and ``X-Slack-Signature``.

    ``timestamp`` defaults to now; pass an old one to test replay rejection.
    """
    ts = str(int(time.time()) if timestamp is None else timestamp)
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    assert signature is not None
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": signature}


def signed_json(
    secret: str, payload: Mapping[str, Any], timestamp: int | str | None = None
) -> tuple[bytes, dict[str, str]]:
    """Serialise ``payload`` as Slack does for Events API posts; return (body, headers)."""
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", **sign_slack(secret, body, timestamp)}
    return body, headers


def signed_form(
    secret: str, body: bytes | Mapping[str, str], timestamp: int | str | None = None
) -> tuple[bytes, dict[str, str]]:
    """Form-encode (if needed) and sign a slash-command body; return (body, headers)."""
    raw = body if isinstance(body, bytes) else urlencode(dict(body)).encode()
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        **sign_slack(secret, raw, timestamp),
    }
    return raw, headers


def url_verification(
    challenge: str = "challenge-token", token: str = "legacy-token"
) -> dict[str, Any]:
    """The body Slack sends when an Events API request URL is configured."""
    return {"token": token, "challenge": challenge, "type": "url_verification"}


def message_event(
    text: str = "hello",
    *,
    channel: str = CHANNEL_ID,
    user: str = USER_ID,
    ts: str | None = None,
    thread_ts: str | None = None,
    channel_type: str = "channel",
    team: str = TEAM_ID,
    subtype: str | None = None,
) -> dict[str, Any]:
    """A ``message`` event (the inner ``event`` of an ``event_callback``)."""
    ts = ts or _new_ts()
    event: dict[str, Any] = {
        "type": "message",
        "channel": channel,
        "user": user,
        "text": text,
        "ts": ts,
        "event_ts": ts,
        "channel_type": channel_type,
        "team": team,
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
    if subtype:
        event["subtype"] = subtype
    return event


def app_mention_event(
    text: str = "hello",
    *,
    channel: str = CHANNEL_ID,
    user: str = USER_ID,
    bot_user_id: str = BOT_USER_ID,
    ts: str | None = None,
    thread_ts: str | None = None,
    team: str = TEAM_ID,
) -> dict[str, Any]:
    """An ``app_mention`` event; the text starts with ``<@bot_user_id>`` as Slack sends it."""
    event = message_event(
        f"<@{bot_user_id}> {text}",
        channel=channel,
        user=user,
        ts=ts,
        thread_ts=thread_ts,
        team=team,
    )
    event["type"] = "app_mention"
    del event["channel_type"]
    return event


def event_callback(
    event: Mapping[str, Any] | None = None,
    *,
    event_type: str = "message",
    text: str = "hello",
    event_id: str | None = None,
    team_id: str = TEAM_ID,
    api_app_id: str = APP_ID,
    bot_user_id: str = BOT_USER_ID,
    **event_kwargs: Any,
) -> dict[str, Any]:
    """An Events API ``event_callback`` envelope with a unique ``event_id``.

    Pass a ready ``event`` or let it build one: ``event_type`` ``"message"`` or
    ``"app_mention"`` with ``text`` and ``message_event`` keywords (channel, user,
    ts, thread_ts ...).  Reuse the same ``event_id`` to simulate a Slack retry.
    """
    if event is None:
        if event_type == "app_mention":
            inner = app_mention_event(text, bot_user_id=bot_user_id, team=team_id, **event_kwargs)
        elif event_type == "message":
            inner = message_event(text, team=team_id, **event_kwargs)
        else:
            raise ValueError(f"unsupported event_type {event_type!r}; pass event=")
    else:
        inner = dict(event)
    return {
        "token": "legacy-token",
        "team_id": team_id,
        "api_app_id": api_app_id,
        "event": inner,
        "type": "event_callback",
        "event_id": event_id or f"Ev{next(_event_counter):08d}{uuid.uuid4().hex[:6].upper()}",
        "event_time": int(time.time()),
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": team_id,
                "user_id": bot_user_id,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
        "event_context": f"4-{uuid.uuid4().hex}",
    }


def slash_command_body(
    command: str = "/gw",
    text: str = "",
    *,
    response_url: str = "http://127.0.0.1:9/response/unused",
    user_id: str = USER_ID,
    user_name: str = "alice",
    channel_id: str = CHANNEL_ID,
    channel_name: str = "general",
    team_id: str = TEAM_ID,
    team_domain: str = "fake",
    trigger_id: str | None = None,
    api_app_id: str = APP_ID,
) -> bytes:
    """Form-encoded slash-command body as Slack POSTs it (sign it with ``sign_slack``).

    Point ``response_url`` at ``FakeSlack.new_response_url()`` to capture ``respond()``.
    """
    fields = {
        "token": "legacy-token",
        "team_id": team_id,
        "team_domain": team_domain,
        "channel_id": channel_id,
        "channel_name": channel_name,
        "user_id": user_id,
        "user_name": user_name,
        "command": command,
        "text": text,
        "api_app_id": api_app_id,
        "is_enterprise_install": "false",
        "response_url": response_url,
        "trigger_id": trigger_id
        or f"{int(time.time())}.{uuid.uuid4().int % 10**12}.{uuid.uuid4().hex}",
    }
    return urlencode(fields).encode()


# --- the fake Web API ------------------------------------------------------------


class SlackApiFailure(Exception):
    """Raised inside method handlers to answer ``{"ok": false, "error": ...}``."""

    def __init__(self, error: str, status: int = 200) -> None:
        super().__init__(error)
        self.error = error
        self.status = status


class FakeSlack(FakeServer):
    """In-memory Slack Web API: messages per channel, response_url capture, faults.

    ``token``: when given, requests must carry it (``Authorization: Bearer`` or
    a ``token`` param) or get ``invalid_auth``/``not_authed`` like Slack; when
    ``None`` any token is accepted.
    """

    def __init__(
        self,
        token: str | None = None,
        *,
        team_id: str = TEAM_ID,
        team: str = "Fake Team",
        user_id: str = BOT_USER_ID,
        user: str = "gateway-bot",
        bot_id: str = BOT_ID,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port)
        self.token = token
        self.team_id = team_id
        self.team = team
        self.user_id = user_id
        self.user = user
        self.bot_id = bot_id
        #: every message stored per channel, oldest first (posted by the bot or seeded)
        self.messages: dict[str, list[dict[str, Any]]] = {}

    # public helpers --------------------------------------------------------
    @property
    def api_url(self) -> str:
        """Web API base for ``SLACK_API_URL`` / ``AsyncWebClient(base_url=...)``; ends in ``/``."""
        return f"{self.url}/api/"

    def new_response_url(self, response_id: str | None = None) -> str:
        """A ``response_url`` on this fake; POSTs to it are recorded as ``response_url`` calls."""
        return f"{self.url}/response/{response_id or uuid.uuid4().hex}"

    def posted_messages(self, channel: str | None = None) -> list[dict[str, Any]]:
        """Params of each chat.postMessage (channel, text, thread_ts ...), maybe per channel."""
        return [
            c.params
            for c in self.calls_to("chat.postMessage")
            if channel is None or c.params.get("channel") == channel
        ]

    def posted_texts(self, channel: str | None = None) -> list[str]:
        """Just the ``text`` of ``posted_messages``."""
        return [str(p.get("text", "")) for p in self.posted_messages(channel)]

    def shown(self, channel: str) -> list[list[str]]:
        """Per bot message in the channel, oldest first: the text it was posted with, then
        the text of each successful ``chat.update``."""
        return self.displayed.in_chat(channel)

    def updates(self, channel: str | None = None) -> list[dict[str, Any]]:
        """Params of every chat.update call (refused ones included)."""
        return [
            c.params
            for c in self.calls_to("chat.update")
            if channel is None or c.params.get("channel") == channel
        ]

    def responses(self, response_id: str | None = None) -> list[dict[str, Any]]:
        """JSON bodies POSTed to response URLs (each has ``_response_id``)."""
        return [
            c.params
            for c in self.calls_to("response_url")
            if response_id is None or c.params.get("_response_id") == response_id
        ]

    async def wait_for_posts(
        self, count: int = 1, channel: str | None = None, timeout: float = 5.0
    ) -> list[dict[str, Any]]:
        """Wait until at least ``count`` chat.postMessage calls (to ``channel``); return them."""
        return await self.wait_for_count(
            lambda: self.posted_messages(channel), count, timeout,
            f"{count} chat.postMessage to {channel}; calls {self.method_names()}")

    async def wait_for_responses(
        self, count: int = 1, timeout: float = 5.0
    ) -> list[dict[str, Any]]:
        """Wait until at least ``count`` response_url POSTs arrived; return them."""
        return await self.wait_for_count(
            self.responses, count, timeout, f"{count} response_url POSTs")

    def add_message(
        self,
        channel: str,
        text: str,
        *,
        user: str = USER_ID,
        ts: str | None = None,
        thread_ts: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Seed a message into a channel for conversations.history/replies (with
        ``metadata``, as one the bot posted carrying it)."""
        message: dict[str, Any] = {
            "type": "message",
            "user": user,
            "text": text,
            "ts": ts or _new_ts(),
        }
        if thread_ts:
            message["thread_ts"] = thread_ts
        if metadata is not None:
            message["metadata"] = metadata
        self._store(channel, message)
        return message

    def fail_next(
        self,
        method: str,
        status: int = 429,
        retry_after: int = 1,
        count: int = 1,
        error: str | None = None,
    ) -> None:
        """Answer the next ``count`` calls of ``method`` with an error.

        ``method`` is a Web API method, ``"response_url"`` or ``"*"`` (any).

        429 → HTTP 429 + ``Retry-After`` + ``{"ok": false, "error": "ratelimited"}``
        (slack_sdk raises ``SlackApiError``, status 429).  ``status=200`` with
        ``error="channel_not_found"`` gives Slack's usual in-band error; other
        statuses (500, 503) answer ``{"ok": false, "error": error or "internal_error"}``.
        """
        self._queue_fault(
            method,
            Fault(
                status=status,
                retry_after=retry_after if status == 429 else None,
                description=error,
                remaining=count,
            ),
        )

    def answer_late(self, method: str, seconds: float, *, count: int = 1) -> None:
        """The next ``count`` calls of ``method`` take effect at once (a message is stored)
        and are answered ``seconds`` late: a caller killed meanwhile never saw its answer."""
        self._queue_fault(method, Fault(status=0, delay=seconds, remaining=count))

    # server ----------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_post("/response/{response_id}", self._handle_response_url)
        return app

    @staticmethod
    def _fault_response(fault: Fault) -> web.Response:
        if fault.status == 429:
            return json_response(
                {"ok": False, "error": fault.description or "ratelimited"},
                status=429,
                headers={"Retry-After": str(fault.retry_after or 1)},
            )
        default = "internal_error" if fault.status >= 500 else "fatal_error"
        return json_response(
            {"ok": False, "error": fault.description or default}, status=fault.status
        )

    @staticmethod
    def _bearer(request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        return auth[7:] if auth.startswith("Bearer ") else None

    async def _handle_api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await read_params(request)
        token = self._bearer(request) or params.get("token")
        self.record(method, params, request, token=token)
        fault = self.take_fault(method)
        if fault is not None and fault.status:
            return self._fault_response(fault)
        if self.token is not None:
            if not token:
                return json_response({"ok": False, "error": "not_authed"})
            if token != self.token:
                return json_response({"ok": False, "error": "invalid_auth"})
        handler = getattr(self, "_m_" + method.replace(".", "_"), None)
        if handler is None:
            return json_response(
                {"ok": False, "error": "unknown_method", "req_method": method}, status=404
            )
        try:
            result = await handler(params)
        except SlackApiFailure as exc:
            return json_response({"ok": False, "error": exc.error}, status=exc.status)
        if fault is not None:  # answer_late: done, answered later
            await asyncio.sleep(fault.delay)
        return json_response({"ok": True, **result})

    async def _handle_response_url(self, request: web.Request) -> web.Response:
        params = await read_params(request)
        params["_response_id"] = request.match_info["response_id"]
        self.record("response_url", params, request)
        fault = self.take_fault("response_url")
        if fault is not None:
            return self._fault_response(fault)
        return web.Response(text="ok", content_type="text/plain")

    # Web API methods ---------------------------------------------------------
    def _store(self, channel: str, message: dict[str, Any]) -> None:
        self.messages.setdefault(channel, []).append(message)

    def _find(self, channel: str, ts: str) -> dict[str, Any] | None:
        for message in self.messages.get(channel, []):
            if message.get("ts") == ts:
                return message
        return None

    @staticmethod
    def _channel(params: dict[str, Any]) -> str:
        channel = params.get("channel")
        if not channel:
            raise SlackApiFailure("channel_not_found")
        return str(channel)

    async def _m_auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": f"{self.url}/",
            "team": self.team,
            "user": self.user,
            "team_id": self.team_id,
            "user_id": self.user_id,
            "bot_id": self.bot_id,
            "bot_user_id": self.user_id,
            "is_enterprise_install": False,
        }

    async def _m_chat_postMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(params)
        if not (params.get("text") or params.get("blocks") or params.get("attachments")):
            raise SlackApiFailure("no_text")
        message: dict[str, Any] = {
            "type": "message",
            "user": self.user_id,
            "bot_id": self.bot_id,
            "text": str(params.get("text", "")),
            "ts": _new_ts(),
            "team": self.team_id,
        }
        if params.get("thread_ts"):
            message["thread_ts"] = str(params["thread_ts"])
        for key in ("blocks", "attachments", "metadata"):
            if key in params:
                message[key] = params[key]
        self._store(channel, message)
        self.displayed.posted(channel, message["ts"], message["text"])
        return {"channel": channel, "ts": message["ts"], "message": message}

    async def _m_chat_postEphemeral(self, params: dict[str, Any]) -> dict[str, Any]:
        self._channel(params)
        return {"message_ts": _new_ts()}

    async def _m_chat_update(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(params)
        message = self._find(channel, str(params.get("ts", "")))
        if message is None:
            raise SlackApiFailure("message_not_found")
        if message.get("user") != self.user_id:
            raise SlackApiFailure("cant_update_message")
        text = str(params.get("text", message.get("text", "")))
        if len(text) > MAX_TEXT:
            raise SlackApiFailure("msg_too_long")
        message["text"] = text
        message["edited"] = {"user": self.user_id, "ts": _new_ts()}
        if "metadata" in params:
            message["metadata"] = params["metadata"]
        self.displayed.edited(channel, message["ts"], text)
        return {
            "channel": channel,
            "ts": message["ts"],
            "text": message["text"],
            "message": message,
        }

    async def _m_reactions_add(self, params: dict[str, Any]) -> dict[str, Any]:
        self._channel(params)
        return {}

    async def _m_conversations_history(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(params)
        oldest = float(params.get("oldest") or 0)
        latest = float(params.get("latest") or "inf")
        limit = int(params.get("limit") or 100)
        top = [
            m
            for m in self.messages.get(channel, [])
            if m.get("thread_ts") in (None, m["ts"]) and oldest < float(m["ts"]) <= latest
        ]
        return _page(list(reversed(top)), params, limit)

    async def _m_conversations_replies(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(params)
        ts = str(params.get("ts", ""))
        parent = self._find(channel, ts)
        if parent is None:
            raise SlackApiFailure("thread_not_found")
        replies = [
            m
            for m in self.messages.get(channel, [])
            if m.get("thread_ts") == ts and m is not parent
        ]
        oldest = float(params.get("oldest") or 0)
        later = [m for m in replies if float(m["ts"]) > oldest]
        return _page([parent, *later], params, int(params.get("limit") or 1000))


def _page(messages: list[dict[str, Any]], params: dict[str, Any],
          limit: int) -> dict[str, Any]:
    """One page of ``messages`` (in the order Slack lists them) from ``params["cursor"]``,
    with the cursor of the next one when more are left, as Slack paginates."""
    start = int(str(params.get("cursor") or "0").removeprefix("next:") or 0)
    end = start + max(1, limit)
    more = end < len(messages)
    return {"messages": messages[start:end], "has_more": more,
            "response_metadata": {"next_cursor": f"next:{end}" if more else ""}}
