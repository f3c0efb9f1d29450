"""Telegram bot: python-telegram-bot inside our aiohttp app, no second server.

Webhook mode: ``POST /telegram/webhook`` checks ``X-Telegram-Bot-Api-Secret-Token`` in
constant time (403 otherwise), then claims ``dedup:telegram-update:<bot_id>:<update_id>`` (a
TTL claim, not a highest-id mark: ids turn random after a week of silence) and puts the
message in the inbox in one step, and only then answers 200: an acknowledged update is
durable. The inbox consumer of whichever replica is alive answers it. Polling mode (``gateway
serve --telegram-polling``): our own loop long-polls ``getUpdates`` (``telegram_polling.py``)
and the same path follows; an update is confirmed to Telegram (the next poll's offset) only
once it is in the inbox, so one refused (a full chat, a store out of reach, maintenance) is
fetched again. PTB does the Bot API work (parsing updates, sending); the token stays out of
logs because httpx is held at WARNING and the log filter masks ``bot<id>:<token>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from aiohttp import web
from telegram import Update
from telegram.constants import ChatAction
from telegram.error import BadRequest, Forbidden, RetryAfter, TelegramError
from telegram.ext import Application

from gateway import keys
from gateway.api import routes
from gateway.api.errors import RETRY_AFTER_SECONDS, ApiError
from gateway.api.spec import Answer, Operation, Param, boolean, integer, obj, string
from gateway.api.state import PUBLIC, add_readiness_check
from gateway.config import ConfigError, Settings
from gateway.conversations.model import Incoming
from gateway.inbound.chat_guard import Guard
from gateway.inbound.http_intake import refuse_during_maintenance
from gateway.inbound.telegram_polling import Poller
from gateway.inbox.component import PlatformInbox, refusal
from gateway.inbox.entry import Entry
from gateway.outbound.chat import register_poster
from gateway.outbound.delivery import Send
from gateway.outbound.errors import RetryLater, Undeliverable, retry_after_of
from gateway.outbound.live import PlatformReply
from gateway.stores.runtime import Runtime

# PTB 22 warns on every RetryAfter that time periods will become timedeltas; opt in now (it
# reads the variable at each use). Our only time period is retry_after, and
# gateway.outbound.errors.retry_after_of reads both forms.
os.environ.setdefault("PTB_TIMEDELTA", "1")

log = logging.getLogger("gateway.telegram")

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
ALLOWED_UPDATES = ["message"]

TelegramApp = Application[Any, Any, Any, Any, Any, Any]


def build_application(settings: Settings) -> TelegramApp:
    """A PTB Application pointed at ``TELEGRAM_API_URL`` (PTB appends ``<token>/<method>``),
    without PTB's Updater (polling is ours: ``telegram_polling.py``)."""
    if not settings.telegram_bot_token:
        raise ConfigError("TELEGRAM_BOT_TOKEN", "is required")
    root = settings.telegram_api_url.rstrip("/")
    return (Application.builder().token(settings.telegram_bot_token.get())
            .base_url(f"{root}/bot").base_file_url(f"{root}/file/bot").updater(None).build())


def to_incoming(update: Update) -> Incoming | None:
    """The conversation message an update carries, or None (not a user's text message)."""
    message = update.message
    if message is None or message.text is None or message.from_user is None:
        return None
    user = message.from_user
    if user.is_bot:
        return None
    return Incoming(platform="telegram", chat=str(message.chat.id), thread=None,
                    user_id=str(user.id), user_name=user.username or user.full_name,
                    text=message.text, message_id=str(message.message_id))


class TelegramBot:
    """One bot: its PTB Application, the webhook route and its inbox."""

    def __init__(self, runtime: Runtime, guard: Guard, *, polling: bool = False) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.polling = polling
        self.ptb = build_application(self.settings)
        self.inbox = PlatformInbox(runtime, "telegram", self._sender)
        self.guard = guard
        self.ready = asyncio.Event()
        section = self.settings.section("telegram")
        self.retry_init = float(section.get("init_retry_seconds", 5.0))
        self.poller = Poller(self.ptb.bot, self._accept_polled,
                             timeout=int(section.get("poll_timeout", 10)),
                             retry_seconds=float(section.get("poll_retry_seconds", 1.0)),
                             allowed_updates=ALLOWED_UPDATES)
        self._polling: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Connect (getMe) and, in polling mode, start the Updater. Retries until Telegram
        answers, so an unreachable Bot API never keeps the rest of the gateway down."""
        while True:
            try:
                await self.ptb.initialize()
                break
            except TelegramError as exc:
                log.warning("telegram: getMe failed (%s); retrying in %.0f s",
                            type(exc).__name__, self.retry_init)
                await asyncio.sleep(self.retry_init)
        if self.polling:
            await self.poller.start()
            self._polling = asyncio.create_task(self.poller.run())
        self.ready.set()
        log.info("telegram: bot %s ready (%s)", self.ptb.bot.id,
                 "long polling" if self.polling else "webhook")

    async def stop(self) -> None:
        if self._polling is not None:
            self._polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._polling
            self._polling = None
            await self.poller.confirm()
        if self.ready.is_set():
            await self.ptb.shutdown()
        self.ready.clear()

    # --- inbound -----------------------------------------------------------------------
    async def webhook(self, request: web.Request) -> web.Response:
        ip = await self.guard.admit(request)
        secret = self.settings.telegram_webhook_secret
        offered = request.headers.get(SECRET_HEADER, "")
        # Header bytes that are not UTF-8 arrive as surrogate escapes: compare the bytes sent.
        if not secret or not hmac.compare_digest(offered.encode("utf-8", "surrogateescape"),
                                                 secret.get().encode()):
            raise await self.guard.refuse(
                ip, ApiError(403, "forbidden", f"missing or wrong {SECRET_HEADER}"))
        try:
            data = await request.json()
        except ValueError:
            raise ApiError(400, "bad_request", "body must be a JSON Telegram update") from None
        if not isinstance(data, dict) or not isinstance(data.get("update_id"), int):
            raise ApiError(400, "bad_request", "body must be a Telegram update with update_id")
        if not self.ready.is_set():
            raise ApiError(503, "unavailable", "telegram bot is starting",
                           {"Retry-After": str(RETRY_AFTER_SECONDS)})
        try:
            update = Update.de_json(data, self.ptb.bot)
        except Exception as exc:  # PTB's parser trips on a wrong shape in
            # whatever way that shape leads it to (KeyError, TypeError, AttributeError...)
            raise ApiError(400, "bad_request",
                           f"not a Telegram update: {type(exc).__name__}") from None
        await self.accept(update)
        return web.json_response({"ok": True})

    async def _accept_polled(self, update: Update) -> None:
        """As the webhook does after its checks: refused during maintenance (fetched again
        later), else stored."""
        await refuse_during_maintenance(self.guard.maintenance)
        await self.accept(update)

    async def accept(self, update: Update) -> None:
        """Claim the update and put it in the inbox (one round trip); the platform gets its
        200 after that. A duplicate is answered as a success. A chat with too many messages
        waiting is refused with 503 (Telegram retries), as is a store that fails."""
        incoming = to_incoming(update)
        if incoming is None:
            return
        claim = keys.dedup_telegram_update(self.ptb.bot.id, update.update_id)
        refused = refusal(await self.inbox.push(Entry(incoming), claim))
        if refused is not None:
            raise refused

    # --- outbound ----------------------------------------------------------------------
    def _sender(self, entry: Entry, retried: bool) -> Send:
        return TelegramReply(self.ptb, int(entry.incoming.chat))


class TelegramReply(PlatformReply):
    """sendMessage, editMessageText and the typing action for one chat; platform errors
    mapped for the outbound retry loop. Telegram offers no way to look for an earlier reply,
    so a retry whose message id was never recorded posts anew."""

    def __init__(self, ptb: TelegramApp, chat_id: int) -> None:
        self.bot = ptb.bot
        self.chat_id = chat_id

    async def typing(self) -> None:
        await _mapped(self.bot.send_chat_action(chat_id=self.chat_id,
                                                action=ChatAction.TYPING))

    async def post(self, text: str, *, first: bool = True) -> str:
        message = await _mapped(self.bot.send_message(chat_id=self.chat_id, text=text))
        return str(message.message_id)

    async def edit(self, ref: str, text: str) -> None:
        try:
            await _mapped(self.bot.edit_message_text(text, chat_id=self.chat_id,
                                                     message_id=int(ref)))
        except Undeliverable as exc:
            if NOT_MODIFIED not in str(exc).lower():  # already showing it: done
                raise


class TelegramPoster:
    """Notifications to a Telegram chat (``gateway.outbound.chat``): sendMessage. The Bot
    API cannot list what a chat holds, so there is no look before a retried post."""

    platform = "telegram"
    can_look = False

    def __init__(self, bot: TelegramBot) -> None:
        self.bot = bot

    async def post(self, chat: str, text: str, mark: str) -> None:
        if not self.bot.ready.is_set():
            raise RuntimeError("telegram: the bot is starting")
        chat_id: int | str = int(chat) if chat.lstrip("-").isdigit() else chat  # or @channel
        await _mapped(self.bot.ptb.bot.send_message(chat_id=chat_id, text=text))

    async def posted(self, chat: str, mark: str, since: float) -> bool:
        return False


NOT_MODIFIED = "message is not modified"
T = TypeVar("T")


async def _mapped(call: Awaitable[T]) -> T:
    """A Bot API call; a flood wait becomes ``RetryLater``, a refusal ``Undeliverable``."""
    try:
        return await call
    except RetryAfter as exc:
        raise RetryLater(retry_after_of(exc) or 1.0) from exc
    except (Forbidden, BadRequest) as exc:
        raise Undeliverable(f"{type(exc).__name__}: {exc}") from exc


# --- component ---------------------------------------------------------------------------
TELEGRAM_BOT: web.AppKey[TelegramBot] = web.AppKey("telegram_bot", TelegramBot)


WEBHOOK = Operation(
    "A Telegram update (the Bot API's webhook), taken into the chat's inbox",
    {200: Answer("taken in, or seen before", obj({"ok": boolean()}))},
    errors={400: "not a Telegram update",
            403: f"missing or wrong {SECRET_HEADER} (counted by the address's barrier)",
            429: "this address sent too many wrong secrets: blocked for a cool-down",
            503: "maintenance, the bot is starting, or the chat has too many messages "
                 "waiting (Telegram retries)"},
    body=obj({"update_id": integer()}, more=True),
    params=(Param(SECRET_HEADER, string(), "TELEGRAM_WEBHOOK_SECRET", where="header"),),
    signed=(SECRET_HEADER,), tag="platforms")


def setup(app: web.Application, runtime: Runtime) -> None:
    """Mount the webhook and run the bot while the app runs (only with TELEGRAM_BOT_TOKEN)."""
    if not runtime.settings.telegram_bot_token:
        return
    if not runtime.settings.telegram_webhook_secret and not runtime.settings.telegram_polling:
        log.warning("telegram: TELEGRAM_WEBHOOK_SECRET is not set; the webhook refuses all")
    bot = TelegramBot(runtime, Guard(app, runtime), polling=runtime.settings.telegram_polling)
    app[TELEGRAM_BOT] = bot
    register_poster(app, TelegramPoster(bot))
    routes.post(app, "/telegram/webhook", bot.webhook, scope=PUBLIC,  # secret header
                doc=WEBHOOK, budget=routes.WRITE_BUDGET_SECONDS)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        starting = asyncio.create_task(bot.start())
        yield
        if not starting.done():
            starting.cancel()
        [outcome] = await asyncio.gather(starting, return_exceptions=True)
        if isinstance(outcome, Exception):
            log.error("telegram: bot did not start", exc_info=outcome)
        await bot.stop()

    async def readiness() -> tuple[bool, str]:
        mode = "long polling" if bot.polling else "webhook"
        return bot.ready.is_set(), f"{mode}, {'ready' if bot.ready.is_set() else 'starting'}"

    app.cleanup_ctx.append(lifecycle)
    # After the bot's own: stopped first, so the replies in flight still have a bot to go by.
    bot.inbox.run_with(app, bot.ready)
    # Not required: a Bot API outage must not take the other routes out of rotation.
    add_readiness_check(app, "telegram", readiness, required=False)


# --- CLI: gateway telegram set-webhook URL -------------------------------------------------
async def set_webhook(settings: Settings, url: str) -> None:
    if not settings.telegram_webhook_secret:
        raise ConfigError("TELEGRAM_WEBHOOK_SECRET", "is required to register the webhook")
    ptb = build_application(settings)
    await ptb.initialize()
    try:
        await ptb.bot.set_webhook(url=url, secret_token=settings.telegram_webhook_secret.get(),
                                  allowed_updates=ALLOWED_UPDATES)
    finally:
        await ptb.shutdown()


def main_set_webhook(args: argparse.Namespace, settings: Settings) -> int:
    try:
        asyncio.run(set_webhook(settings, args.url))
    except TelegramError as exc:
        print(f"gateway telegram set-webhook: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"webhook set: {args.url}")
    return 0
