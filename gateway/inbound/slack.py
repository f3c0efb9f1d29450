"""Slack bot: slack-bolt ``AsyncApp`` mounted on our own aiohttp routes.

``/slack/events`` and ``/slack/commands`` go through Bolt, which verifies the signature and
the timestamp (±5 min) and answers ``url_verification``; its refusals become our JSON 401.
A Bolt middleware claims ``dedup:slack-event:<event_id>`` before any work (a retry can arrive
after 3 s while the first delivery is still running), Bolt acknowledges at once, and the
conversation work runs in our own background set so shutdown can drain it. ``app_mention``
and direct messages reach the conversation service; slash commands (``/gw new``) too.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp, AsyncRespond
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from gateway import keys
from gateway.api import routes
from gateway.api.errors import ApiError
from gateway.conversations.background import Background
from gateway.conversations.service import Incoming, handle_incoming
from gateway.dedup import claims
from gateway.inbound.chat_guard import Guard
from gateway.outbound.delivery import Send
from gateway.outbound.errors import Undeliverable, retry_after_of
from gateway.stores.runtime import Runtime

log = logging.getLogger("gateway.slack")

DRAIN_SECONDS = 30.0
CLAIM = "gateway_dedup_claim"
_MENTION = re.compile(r"^\s*<@[A-Z0-9]+>\s*")
# Errors where resending the same message cannot succeed.
PERMANENT = {"channel_not_found", "not_in_channel", "is_archived", "invalid_auth",
             "account_inactive", "msg_too_long", "no_text", "restricted_action"}



def _incoming(body: dict[str, Any], event: dict[str, Any]) -> Incoming | None:
    """A user's message to the bot (a mention, or a direct message), else None."""
    if event.get("subtype") or event.get("bot_id") or not event.get("user"):
        return None  # edits, joins, other bots (our own are dropped by Bolt already)
    if event.get("type") == "message" and event.get("channel_type") != "im":
        return None  # channel chatter; a mention arrives as app_mention
    text = _MENTION.sub("", str(event.get("text") or ""), count=1).strip()
    if not text:
        return None
    return Incoming(platform="slack", chat=str(event["channel"]),
                    thread=event.get("thread_ts"), user_id=str(event["user"]),
                    user_name=None, text=text, message_id=str(event["ts"]),
                    team=str(body.get("team_id") or event.get("team") or "-"))


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
        self.background = Background("slack")
        self.guard = guard
        self.bolt.middleware(self._dedup)
        self.bolt.event("app_mention")(self._on_event)
        self.bolt.event("message")(self._on_event)
        self.bolt.command(re.compile(r".*"))(self._on_command)

    # --- HTTP --------------------------------------------------------------------------
    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        ip = await self.guard.admit(request)
        response = await self.bolt.async_dispatch(await to_bolt_request(request))
        if response.status == 401:
            raise await self.guard.refuse(ip, ApiError(
                401, "unauthorized", "bad Slack signature or stale timestamp"))
        return await to_aiohttp_response(response)

    # --- Bolt middleware and listeners -------------------------------------------------
    async def _dedup(self, body: dict[str, Any], context: dict[str, Any],
                     next: Callable[[], Awaitable[BoltResponse]]) -> BoltResponse | None:
        """Claim the event before any work; a retry of a claimed event is acknowledged."""
        event_id = body.get("event_id") if body.get("type") == "event_callback" else None
        if event_id:
            claim = await claims.claim(self.runtime.durable, keys.dedup_slack_event(event_id),
                                       self.runtime.settings.dedup_ttl)
            if not claim.claimed:
                return BoltResponse(status=200, body="")
            context[CLAIM] = claim
        return await next()

    async def _on_event(self, body: dict[str, Any], event: dict[str, Any],
                        context: dict[str, Any]) -> None:
        claim: claims.Claim | None = context.get(CLAIM)
        incoming = _incoming(body, event)
        if incoming is None:
            if claim is not None:
                await claims.mark_done(self.runtime.durable, claim,
                                       self.runtime.settings.dedup_ttl)
            return
        self.background.submit(self._process(incoming, self._poster(incoming), claim))

    async def _on_command(self, ack: Callable[..., Awaitable[None]], body: dict[str, Any],
                          respond: AsyncRespond) -> None:
        """``/gw new`` → ``/new``; ``/gw anything`` → ``anything``. Slack shows the ack."""
        await ack()
        words = str(body.get("text") or "").strip()
        command = words.split(maxsplit=1)[0].lower() if words else "help"
        text = f"/{command}" if command in ("new", "status", "help") else words
        incoming = Incoming(platform="slack", chat=str(body["channel_id"]), thread=None,
                            user_id=str(body["user_id"]), user_name=body.get("user_name"),
                            text=text, message_id=str(body.get("trigger_id") or ""),
                            team=str(body.get("team_id") or "-"))

        async def send(reply: str) -> None:
            await respond(text=reply, response_type="in_channel")

        self.background.submit(self._process(incoming, send, None))

    async def _process(self, incoming: Incoming, send: Send,
                       claim: claims.Claim | None) -> None:
        durable, ttl = self.runtime.durable, self.runtime.settings.dedup_ttl
        try:
            await handle_incoming(self.runtime, incoming, send)
        except BaseException:
            if claim is not None:
                with contextlib.suppress(Exception):
                    await claims.release(durable, claim)
            raise
        if claim is not None:
            await claims.mark_done(durable, claim, ttl)

    def _poster(self, incoming: Incoming) -> Send:
        async def send(text: str) -> None:
            """One chat.postMessage (in the thread when the message was in one)."""
            try:
                await self.client.chat_postMessage(channel=incoming.chat, text=text,
                                                   thread_ts=incoming.thread)
            except SlackApiError as exc:
                error = str(exc.response.get("error", "")) if exc.response else ""
                if retry_after_of(exc) is None and error in PERMANENT:
                    raise Undeliverable(f"slack: {error}") from exc
                raise

        return send


SLACK_BOT: web.AppKey[SlackBot] = web.AppKey("slack_bot", SlackBot)


def setup(app: web.Application, runtime: Runtime) -> None:
    """Mount /slack/events and /slack/commands (only with SLACK_BOT_TOKEN and
    SLACK_SIGNING_SECRET)."""
    settings = runtime.settings
    if not (settings.slack_bot_token and settings.slack_signing_secret):
        return
    bot = SlackBot(runtime, Guard(app, runtime))
    app[SLACK_BOT] = bot
    routes.post(app, "/slack/events", bot.dispatch)
    routes.post(app, "/slack/commands", bot.dispatch)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        yield
        await bot.background.drain(DRAIN_SECONDS)

    app.cleanup_ctx.append(lifecycle)
