"""Slack bot: slack-bolt ``AsyncApp`` mounted on our own aiohttp routes.

``/slack/events`` and ``/slack/commands`` are checked first here (signature and ±5 min
timestamp over the raw bytes, ``signing.verify_slack``: a wrong or malformed one counts at the
barrier, a genuine stale one does not; then a body Bolt could not parse is a 400), then go
through Bolt, which verifies again and answers ``url_verification``; its refusals become our
JSON 401 (or the JSON error of their status).
A Bolt middleware then does the intake itself, before Bolt acknowledges: an ``app_mention``
or direct message is claimed (``dedup:slack-event:<event_id>``; a retry can arrive after 3 s)
and put in the inbox in one round trip, a slash command (``/gw new``) is put in the inbox with
its ``response_url``; only then does Slack get its 200, well inside its 3 s. The inbox
consumer of whichever replica is alive answers (``chat.postMessage``, edited with
``chat.update`` while a streamed reply is written; or once at the command's
``response_url``). Other events are acknowledged and dropped.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from redis.exceptions import RedisError
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse
from slack_sdk.webhook.async_client import AsyncWebhookClient

from gateway import keys
from gateway.api import routes
from gateway.api.errors import ApiError, store_error
from gateway.api.spec import Answer, Operation, Param, obj, string
from gateway.api.state import PUBLIC
from gateway.conversations.model import Incoming
from gateway.inbound import signing
from gateway.inbound.chat_guard import Guard
from gateway.inbound.http_intake import read_body
from gateway.inbox.component import PlatformInbox, refusal
from gateway.inbox.entry import Entry
from gateway.outbound.chat import NOTIFICATION_EVENT, register_poster
from gateway.outbound.delivery import Send
from gateway.outbound.errors import Undeliverable, retry_after_of
from gateway.outbound.live import PlatformReply
from gateway.stores.runtime import Runtime

log = logging.getLogger("gateway.slack")

_MENTION = re.compile(r"^\s*<@[A-Z0-9]+>\s*")
# Errors where resending the same message cannot succeed.
PERMANENT = {"channel_not_found", "not_in_channel", "is_archived", "invalid_auth",
             "account_inactive", "msg_too_long", "no_text", "restricted_action",
             "message_not_found", "cant_update_message", "edit_window_closed"}
RESPONSE_URL = "response_url"
# Every reply carries Slack message metadata naming the message it answers, so a holder that
# takes over a dead one's entry can see in the channel whether the reply went out.
REPLY_EVENT = "gateway_reply"


def _incoming(body: dict[str, Any], event: dict[str, Any]) -> Incoming | None:
    """A user's message to the bot (a mention, or a direct message), else None."""
    if event.get("subtype") or event.get("bot_id") or not event.get("user"):
        return None  # edits, joins, other bots (our own included)
    if event.get("type") not in ("app_mention", "message"):
        return None
    if event.get("type") == "message" and event.get("channel_type") != "im":
        return None  # channel chatter; a mention arrives as app_mention
    text = _MENTION.sub("", str(event.get("text") or ""), count=1).strip()
    if not text or not event.get("channel") or not event.get("ts"):
        return None
    return Incoming(platform="slack", chat=str(event["channel"]),
                    thread=event.get("thread_ts"), user_id=str(event["user"]),
                    user_name=None, text=text, message_id=str(event["ts"]),
                    team=str(body.get("team_id") or event.get("team") or "-"))


# What ``/gw <word> ...`` hands the conversation service as the command ``/<word> ...``.
SLASHED = ("link", "subscribe", "unsubscribe", "subscriptions")


def _command(body: dict[str, Any]) -> Entry | None:
    """``/gw new`` → ``/new``; ``/gw anything`` → ``anything``; answered at response_url."""
    if not body.get("channel_id") or not body.get("user_id") or not body.get(RESPONSE_URL):
        return None
    words = str(body.get("text") or "").strip()
    command = words.split(maxsplit=1)[0].lower() if words else "help"
    text = f"/{command}" if command in ("new", "status", "help") else words
    if command in SLASHED:  # /gw link <code>, /gw subscribe <topic>, ...
        text = "/" + words
    incoming = Incoming(platform="slack", chat=str(body["channel_id"]), thread=None,
                        user_id=str(body["user_id"]), user_name=body.get("user_name"),
                        text=text, message_id=str(body.get("trigger_id") or ""),
                        team=str(body.get("team_id") or "-"))
    return Entry(incoming, {RESPONSE_URL: str(body[RESPONSE_URL])})


SHAPE_ERRORS = (AttributeError, KeyError, IndexError, TypeError, ValueError)
JSON_TYPE = "application/json"


def _shape_refusal(exc: Exception) -> ApiError:
    log.warning("slack: a signed body of an unexpected shape (%s)", type(exc).__name__)
    return ApiError(400, "bad_request", "the body is not a Slack payload this gateway reads")


def _checked_text(content_type: str, body: bytes) -> str:
    """The body as text, or 400 for a signed body Bolt would fail on with a traceback: not
    UTF-8, JSON that is not an object, or an event that is not one (Bolt's middlewares call
    ``.get`` on it)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, "bad_request", f"body is not UTF-8 (byte {exc.start})") from None
    if content_type != JSON_TYPE:
        return text  # a form (slash command): any UTF-8 text parses
    try:
        payload = json.loads(text)
    except ValueError:
        raise ApiError(400, "bad_request", "body is not JSON") from None
    if not isinstance(payload, dict):
        raise ApiError(400, "bad_request", "body must be a JSON object")
    event = payload.get("event", {})
    if not isinstance(event, dict) or not isinstance(event.get("type", ""), str):
        raise ApiError(400, "bad_request", "event must be an object with a string type")
    return text


def _refusal(error: ApiError) -> BoltResponse:
    return BoltResponse(status=error.status, headers={**error.headers,
                                                      "Content-Type": JSON_TYPE},
                        body=json.dumps({"error": error.code, "detail": error.detail}))


class SlackBot:
    def __init__(self, runtime: Runtime, guard: Guard) -> None:
        settings = runtime.settings
        assert settings.slack_bot_token and settings.slack_signing_secret
        self.runtime = runtime
        base_url = settings.slack_api_url if settings.slack_api_url.endswith("/") else (
            settings.slack_api_url + "/")  # slack_sdk joins method names with urljoin
        self.client = AsyncWebClient(token=settings.slack_bot_token.get(), base_url=base_url)
        self.bolt = AsyncApp(signing_secret=settings.slack_signing_secret.get(),
                             client=self.client, logger=log)
        self.inbox = PlatformInbox(runtime, "slack", self._sender)
        self.guard = guard
        self.secret = settings.slack_signing_secret.get().encode()
        self.bolt.middleware(self._intake)
        self.bolt.error(self._on_bolt_error)

    # --- HTTP --------------------------------------------------------------------------
    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        ip = await self.guard.admit(request)
        body = await read_body(request)
        try:
            signing.verify_slack(self.secret, request.headers, body, time.time())
        except signing.SignatureError:
            raise await self.guard.refuse(ip, ApiError(
                401, "unauthorized", "bad Slack signature or stale timestamp")) from None
        except signing.StaleSignature as exc:  # genuine but old: a replay, not a guess
            raise ApiError(401, "stale_signature", str(exc)) from None
        text = _checked_text(request.content_type, body)
        try:  # Bolt reads team, user and enterprise ids out of the body as it builds this
            bolt_request = AsyncBoltRequest(body=text, query=request.query_string,
                                            headers=request.headers)  # type: ignore[arg-type]
        except SHAPE_ERRORS as exc:
            raise _shape_refusal(exc) from None
        response = await self.bolt.async_dispatch(bolt_request)
        if response.status == 401:
            raise await self.guard.refuse(ip, ApiError(
                401, "unauthorized", "bad Slack signature or stale timestamp"))
        if response.status >= 400 and response.headers.get("content-type") != [JSON_TYPE]:
            # Bolt's own refusals (e.g. no listener for a signed request) are not ours.
            raise ApiError(response.status, "unhandled", "slack: nothing handles this request")
        return await to_aiohttp_response(response)

    async def _on_bolt_error(self, error: Exception) -> BoltResponse:
        """Bolt's middlewares (ours included) failing on a signed body of an unexpected
        shape: a 400 and one warning line, where Bolt's default handler logs a traceback and
        answers 500. Anything else stays a 500, logged with its traceback."""
        if isinstance(error, SHAPE_ERRORS):
            return _refusal(_shape_refusal(error))
        log.error("slack: request failed", exc_info=error)
        return _refusal(ApiError(500, "internal_error", "unexpected error; see server log"))

    # --- Bolt middleware: the intake ---------------------------------------------------
    async def _intake(self, body: dict[str, Any],
                      next: Callable[[], Awaitable[BoltResponse]]) -> BoltResponse:
        """Make the event durable, then let Bolt answer 200; 503 + Retry-After when
        redis-durable refuses or a chat has too many messages waiting (Slack retries)."""
        if body.get("type") == "event_callback":
            event = body.get("event")
            incoming = _incoming(body, event) if isinstance(event, dict) else None
            entry, claim = None, None
            if incoming is not None and body.get("event_id"):
                entry = Entry(incoming)
                claim = keys.dedup_slack_event(str(body["event_id"]))
        elif body.get("command"):
            entry, claim = _command(body), None
        else:
            return await next()
        if entry is not None:
            try:
                pushed = await self.inbox.push(entry, claim)
            except RedisError as exc:
                mapped = store_error(exc)
                if mapped is None:
                    raise
                return _refusal(mapped)
            refused = refusal(pushed)
            if refused is not None:
                return _refusal(refused)
        return BoltResponse(status=200, body="")

    # --- outbound ----------------------------------------------------------------------
    def _sender(self, entry: Entry, retried: bool) -> Send:
        response_url = entry.route.get(RESPONSE_URL)
        if response_url:
            return self._responder(response_url)
        return SlackReply(self, entry.incoming, retried)

    async def earlier_reply(self, incoming: Incoming) -> dict[str, Any] | None:
        """Our reply to this message in the channel (or thread), its first message, if there
        is one: every message since it is read, page by page (the channel lists newest
        first, so an early reply in a busy channel is on the last page), up to
        ``EARLIER_PAGES`` pages. Unknown (the app lacks the history scope, Slack fails, more
        messages than that) counts as none: better twice than never."""
        ours: list[dict[str, Any]] = []
        cursor: str | None = None
        try:
            for _ in range(EARLIER_PAGES):
                page = await self._since(incoming, cursor)
                ours += [dict(m) for m in page.get("messages") or [] if _answers(m, incoming)]
                cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
                if cursor is None:
                    break
            else:
                if not ours:
                    log.warning("slack: more than %d messages since the one retried; its "
                                "earlier reply was looked for among the newest only",
                                EARLIER_PAGES * PAGE_SIZE)
        except SlackApiError as exc:
            log.warning("slack: cannot read the channel to check for an earlier reply (%s)",
                        exc.response.get("error", "") if exc.response else "error")
        # The reply's first message (a long one goes on in more, naming the same message).
        return min(ours, key=lambda m: float(m["ts"])) if ours else None

    async def _since(self, incoming: Incoming, cursor: str | None) -> AsyncSlackResponse:
        """One page of the messages after ``incoming`` in its thread or channel."""
        if incoming.thread:
            return await self.client.conversations_replies(
                channel=incoming.chat, ts=incoming.thread, oldest=incoming.message_id,
                include_all_metadata=True, limit=PAGE_SIZE, cursor=cursor)
        return await self.client.conversations_history(
            channel=incoming.chat, oldest=incoming.message_id, include_all_metadata=True,
            limit=PAGE_SIZE, cursor=cursor)

    @staticmethod
    def _responder(url: str) -> Send:
        async def send(text: str) -> None:
            """A slash command's answer, posted to its response_url (valid 30 min)."""
            response = await AsyncWebhookClient(url).send(text=text, response_type="in_channel")
            if response.status_code == 429:  # the delivery loop reads its Retry-After
                raise SlackApiError("slack response_url: rate limited", response)
            if response.status_code in (404, 410):
                raise Undeliverable(f"slack response_url: {response.status_code}")
            if response.status_code >= 300:
                raise RuntimeError(f"slack response_url answered {response.status_code}")

        return send


# The look for an earlier reply before a retried one is posted: pages of conversations.history
# (or .replies) of at most PAGE_SIZE messages, at most EARLIER_PAGES of them.
PAGE_SIZE = 200
EARLIER_PAGES = 10


def _answers(message: Mapping[str, Any], incoming: Incoming) -> bool:
    """The message is (part of) our reply to ``incoming``: its metadata names it."""
    metadata = message.get("metadata") or {}
    return bool(metadata.get("event_type") == REPLY_EVENT and (
        metadata.get("event_payload") or {}).get("reply_to") == incoming.message_id)


class SlackReply(PlatformReply):
    """chat.postMessage (in the thread when the message was in one) and chat.update. Every
    reply carries metadata naming the message it answers, so on a retry the channel itself
    shows whether (and in which message) the reply went out. Slack's Web API has no typing
    indicator for bots, so there is none."""

    def __init__(self, bot: SlackBot, incoming: Incoming, retried: bool) -> None:
        self.bot, self.incoming, self.retried = bot, incoming, retried
        self.metadata = {"event_type": REPLY_EVENT,
                         "event_payload": {"reply_to": incoming.message_id}}

    async def post(self, text: str, *, first: bool = True) -> str:
        """A new message; on a retry, the earlier reply brought to ``text`` instead."""
        if self.retried and first:
            earlier = await self.bot.earlier_reply(self.incoming)
            if earlier is not None:
                log.info("slack message %s: answered before its holder stopped",
                         self.incoming.message_id)
                if earlier.get("text") != text:
                    await self.edit(str(earlier["ts"]), text)
                return str(earlier["ts"])
        response = await _mapped(self.bot.client.chat_postMessage(
            channel=self.incoming.chat, text=text, thread_ts=self.incoming.thread,
            metadata=self.metadata))
        return str(response["ts"])

    async def edit(self, ref: str, text: str) -> None:
        await _mapped(self.bot.client.chat_update(channel=self.incoming.chat, ts=ref,
                                                  text=text, metadata=self.metadata))


async def _mapped(call: Awaitable[AsyncSlackResponse]) -> AsyncSlackResponse:
    """A Web API call; an error retrying cannot mend becomes ``Undeliverable``."""
    try:
        return await call
    except SlackApiError as exc:
        error = str(exc.response.get("error", "")) if exc.response else ""
        if retry_after_of(exc) is None and error in PERMANENT:
            raise Undeliverable(f"slack: {error}") from exc
        raise


class SlackPoster:
    """Notifications to a channel (``gateway.outbound.chat``): chat.postMessage with
    metadata carrying the mark, which ``posted`` looks for in the channel's history since
    the post began (pages of ``PAGE_SIZE``, ``EARLIER_PAGES`` at most; unreadable counts as
    not there: better twice than never)."""

    platform = "slack"
    can_look = True

    def __init__(self, bot: SlackBot) -> None:
        self.bot = bot

    async def post(self, chat: str, text: str, mark: str) -> None:
        await _mapped(self.bot.client.chat_postMessage(channel=chat, text=text, metadata={
            "event_type": NOTIFICATION_EVENT, "event_payload": {"mark": mark}}))

    async def posted(self, chat: str, mark: str, since: float) -> bool:
        cursor: str | None = None
        try:
            for _ in range(EARLIER_PAGES):
                page = await self.bot.client.conversations_history(
                    channel=chat, oldest=f"{since:.6f}", include_all_metadata=True,
                    limit=PAGE_SIZE, cursor=cursor)
                if any(_marked(m, mark) for m in page.get("messages") or []):
                    return True
                cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
                if cursor is None:
                    break
        except SlackApiError as exc:
            log.warning("slack: cannot read a channel to check for a notification (%s)",
                        exc.response.get("error", "") if exc.response else "error")
        return False


def _marked(message: Mapping[str, Any], mark: str) -> bool:
    metadata = message.get("metadata") or {}
    return bool(metadata.get("event_type") == NOTIFICATION_EVENT
                and (metadata.get("event_payload") or {}).get("mark") == mark)


SLACK_BOT: web.AppKey[SlackBot] = web.AppKey("slack_bot", SlackBot)


SLACK_SIGNED = ("X-Slack-Signature", "X-Slack-Request-Timestamp")
SLACK_ERRORS = {
    400: "a signed body this gateway cannot read",
    401: "bad Slack signature or stale timestamp (counted by the address's barrier)",
    404: "nothing handles this signed request",
    429: "this address sent too many bad signatures: blocked for a cool-down",
    503: "maintenance, or the chat has too many messages waiting (Slack retries)"}


def _slack(summary: str, media: str) -> Operation:
    return Operation(
        summary, {200: Answer("taken in (Slack's answer, e.g. a url_verification challenge)",
                              string(), media="*/*")},
        errors=SLACK_ERRORS, body=obj(more=True), body_media=media,
        params=tuple(Param(name, string(), "Slack's request signature", where="header")
                     for name in SLACK_SIGNED),
        signed=SLACK_SIGNED, tag="platforms")


EVENTS = _slack("A Slack Events API delivery", "application/json")
COMMANDS = _slack("A Slack slash command", "application/x-www-form-urlencoded")


def setup(app: web.Application, runtime: Runtime) -> None:
    """Mount /slack/events and /slack/commands (only with SLACK_BOT_TOKEN and
    SLACK_SIGNING_SECRET)."""
    settings = runtime.settings
    if not (settings.slack_bot_token and settings.slack_signing_secret):
        return
    bot = SlackBot(runtime, Guard(app, runtime))
    app[SLACK_BOT] = bot
    register_poster(app, SlackPoster(bot))
    for path, doc in (("/slack/events", EVENTS), ("/slack/commands", COMMANDS)):  # signed
        routes.post(app, path, bot.dispatch, scope=PUBLIC, doc=doc,
                    budget=routes.WRITE_BUDGET_SECONDS)
    bot.inbox.run_with(app)
