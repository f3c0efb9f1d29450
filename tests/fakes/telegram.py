"""Fake Telegram Bot API for tests.

Serves ``POST|GET /bot<token>/<method>`` on 127.0.0.1 with the subset of the
Bot API that python-telegram-bot and the gateway use, records every call and
can inject failures, so Telegram code is tested offline against the real
client library.  Pass ``fake.api_url`` as ``TELEGRAM_API_URL`` (the gateway
appends ``/bot<token>/<method>``) or ``f"{fake.api_url}/bot"`` as PTB's
``base_url``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import zlib
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.base import Call, FakeServer, Fault, json_response, read_params

__all__ = ["FakeTelegram", "text_update"]

_DESCRIPTIONS = {
    400: "Bad Request: injected fault",
    401: "Unauthorized",
    403: "Forbidden: bot was blocked by the user",
    404: "Not Found",
    409: "Conflict: injected fault",
    500: "Internal Server Error",
    502: "Bad Gateway",
}

_update_ids = itertools.count(100_000)

MAX_TEXT = 4096  # characters of one message's text
NOT_MODIFIED = ("Bad Request: message is not modified: specified new message content and "
                "reply markup are exactly the same as a current content and reply markup of "
                "the message")


def text_update(
    text: str,
    chat_id: int = 777,
    *,
    user_id: int | None = None,
    update_id: int | None = None,
    message_id: int | None = None,
    first_name: str = "Alice",
    username: str = "alice",
    chat_type: str | None = None,
) -> dict[str, Any]:
    """Build a Telegram ``Update`` dict carrying a text message.

    Usable for ``FakeTelegram.push_update`` (polling) and for POSTing to the
    gateway's ``/telegram/webhook``.  Leading ``/word`` gets a bot_command entity
    so PTB's ``CommandHandler`` matches it.
    """
    uid = update_id if update_id is not None else next(_update_ids)
    sender = user_id if user_id is not None else (chat_id if chat_id > 0 else 4242)
    ctype = chat_type or ("private" if chat_id > 0 else "group")
    chat: dict[str, Any] = {"id": chat_id, "type": ctype}
    if ctype == "private":
        chat["first_name"] = first_name
        chat["username"] = username
    else:
        chat["title"] = f"chat {chat_id}"
    message: dict[str, Any] = {
        "message_id": message_id if message_id is not None else uid,
        "date": int(time.time()),
        "chat": chat,
        "from": {"id": sender, "is_bot": False, "first_name": first_name, "username": username},
        "text": text,
    }
    if text.startswith("/"):
        command = text.split()[0]
        message["entities"] = [{"type": "bot_command", "offset": 0, "length": len(command)}]
    return {"update_id": uid, "message": message}


class TelegramApiError(Exception):
    """Raised inside handlers to answer ``{"ok": false, ...}`` with a status."""

    def __init__(
        self, status: int, description: str, parameters: dict[str, Any] | None = None
    ) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters


class FakeTelegram(FakeServer):
    """In-memory Bot API: messages, webhook registration and a getUpdates queue.

    ``token``: when given, other tokens get 401 ``Unauthorized`` (as Telegram
    answers); when ``None`` any token is accepted.
    """

    def __init__(
        self,
        token: str | None = None,
        *,
        bot_id: int = 123456789,
        username: str = "fake_gateway_bot",
        first_name: str = "Fake Gateway Bot",
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port)
        self.token = token
        self.bot_user: dict[str, Any] = {
            "id": bot_id,
            "is_bot": True,
            "first_name": first_name,
            "username": username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }
        #: current webhook registration (``url`` empty when none), as set by setWebhook
        self.webhook: dict[str, Any] = {"url": ""}
        #: unconfirmed updates waiting for getUpdates
        self.pending_updates: list[dict[str, Any]] = []
        self._next_update_id = 1
        self._message_ids = itertools.count(1)
        self._poll_generation = 0
        self._wakeup: asyncio.Event | None = None

    # public helpers --------------------------------------------------------
    @property
    def api_url(self) -> str:
        """Bot API root for ``TELEGRAM_API_URL``; calls go to ``{api_url}/bot<token>/<method>``."""
        return self.url

    @property
    def base_url(self) -> str:
        """Value for PTB's ``ApplicationBuilder.base_url`` (the token is appended to it)."""
        return f"{self.url}/bot"

    @property
    def webhook_url(self) -> str:
        """URL registered by setWebhook, ``""`` when none."""
        return str(self.webhook.get("url") or "")

    def push_update(self, update: Mapping[str, Any]) -> int:
        """Queue an update for getUpdates (assigning ``update_id`` if missing); returns the id.

        Wakes a pending long poll at once.
        """
        data = dict(update)
        if "update_id" not in data:
            data["update_id"] = self._next_update_id
        self._next_update_id = max(self._next_update_id, int(data["update_id"]) + 1)
        self.pending_updates.append(data)
        self._notify()
        return int(data["update_id"])

    def sent_messages(self, chat_id: int | str | None = None) -> list[dict[str, Any]]:
        """Params of every sendMessage call, optionally for one chat (ids compared as strings)."""
        return [
            c.params
            for c in self.calls_to("sendMessage")
            if chat_id is None or str(c.params.get("chat_id")) == str(chat_id)
        ]

    def sent_texts(self, chat_id: int | str | None = None) -> list[str]:
        """Just the ``text`` of ``sent_messages``."""
        return [str(p.get("text", "")) for p in self.sent_messages(chat_id)]

    def shown(self, chat_id: int | str) -> list[list[str]]:
        """Per bot message in the chat, oldest first: the text it was sent with, then the
        text of each successful ``editMessageText``."""
        return self.displayed.in_chat(chat_id)

    def edits(self, chat_id: int | str | None = None) -> list[dict[str, Any]]:
        """Params of every editMessageText call (refused ones included)."""
        return [
            c.params
            for c in self.calls_to("editMessageText")
            if chat_id is None or str(c.params.get("chat_id")) == str(chat_id)
        ]

    def chat_actions(self, chat_id: int | str | None = None) -> list[Call]:
        """The sendChatAction calls (``params["action"]`` is ``typing`` ...), oldest first."""
        return [
            c
            for c in self.calls_to("sendChatAction")
            if chat_id is None or str(c.params.get("chat_id")) == str(chat_id)
        ]

    async def wait_for_messages(
        self, count: int = 1, chat_id: int | str | None = None, timeout: float = 5.0
    ) -> list[dict[str, Any]]:
        """Wait until at least ``count`` messages were sent (to ``chat_id``); return them."""
        return await self.wait_for_count(
            lambda: self.sent_messages(chat_id), count, timeout,
            f"{count} sendMessage to {chat_id}; calls {self.method_names()}")

    def fail_next(
        self,
        method: str,
        status: int = 429,
        retry_after: int = 1,
        count: int = 1,
        description: str | None = None,
    ) -> None:
        """Answer the next ``count`` calls of ``method`` (``"*"``: any) with an error.

        429 carries ``parameters.retry_after`` (PTB raises ``RetryAfter``);
        500/502 become PTB ``NetworkError``; 400 ``BadRequest``; 403 ``Forbidden``.
        """
        self._queue_fault(
            method.lower() if method != "*" else "*",
            Fault(
                status=status,
                retry_after=retry_after if status == 429 else None,
                description=description,
                remaining=count,
            ),
        )

    async def deliver_webhook(
        self,
        update: Mapping[str, Any],
        url: str | None = None,
        secret_token: str | None = None,
        timeout: float = 10.0,
    ) -> int:
        """POST ``update`` to a webhook as Telegram would; returns the HTTP status.

        Defaults to the URL and ``secret_token`` registered through setWebhook.
        """
        target = url or self.webhook_url
        if not target:
            raise RuntimeError("no webhook URL given or registered")
        secret = secret_token if secret_token is not None else self.webhook.get("secret_token")
        headers = {"X-Telegram-Bot-Api-Secret-Token": str(secret)} if secret else {}
        client_timeout = aiohttp.ClientTimeout(total=timeout)
        async with aiohttp.ClientSession(timeout=client_timeout) as session:
            async with session.post(target, json=dict(update), headers=headers) as resp:
                await resp.read()
                return resp.status

    # server ----------------------------------------------------------------
    def build_app(self) -> web.Application:
        self._wakeup = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        return app

    async def _on_shutdown(self, app: web.Application) -> None:
        await super()._on_shutdown(app)
        self._notify()

    def _notify(self) -> None:
        """Wake every long poll so it re-checks its condition."""
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = asyncio.Event()

    async def _handle(self, request: web.Request) -> web.Response:
        token = request.match_info["token"]
        method = request.match_info["method"]
        params = await read_params(request)
        self.record(method, params, request, token=token)
        if self.token is not None and token != self.token:
            return self._error(401, "Unauthorized")
        fault = self.take_fault(method.lower())
        if fault is not None:
            return self._fault_response(fault)
        handler = getattr(self, f"_m_{method.lower()}", None)
        if handler is None:
            return self._error(404, "Not Found: method not found")
        try:
            result = await handler(params)
        except TelegramApiError as exc:
            return self._error(exc.status, exc.description, exc.parameters)
        except (KeyError, ValueError, TypeError) as exc:
            return self._error(400, f"Bad Request: {exc}")
        return json_response({"ok": True, "result": result})

    @staticmethod
    def _error(
        status: int, description: str, parameters: dict[str, Any] | None = None
    ) -> web.Response:
        body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
        if parameters:
            body["parameters"] = parameters
        return json_response(body, status=status)

    def _fault_response(self, fault: Fault) -> web.Response:
        if fault.status == 429:
            retry = fault.retry_after if fault.retry_after is not None else 1
            return self._error(
                429,
                fault.description or f"Too Many Requests: retry after {retry}",
                {"retry_after": retry},
            )
        return self._error(
            fault.status, fault.description or _DESCRIPTIONS.get(fault.status, "Injected fault")
        )

    # Bot API methods ---------------------------------------------------------
    def _chat(self, chat_id: Any) -> dict[str, Any]:
        text = str(chat_id)
        if text.startswith("@"):
            return {
                "id": -1001000000000 - zlib.crc32(text.encode()) % 1_000_000,
                "type": "channel",
                "title": text[1:],
                "username": text[1:],
            }
        cid = int(text)
        if cid > 0:
            return {"id": cid, "type": "private", "first_name": "User"}
        kind = "supergroup" if text.startswith("-100") else "group"
        return {"id": cid, "type": kind, "title": f"chat {cid}"}

    def _message(self, params: dict[str, Any], **extra: Any) -> dict[str, Any]:
        message: dict[str, Any] = {
            "message_id": next(self._message_ids),
            "date": int(time.time()),
            "chat": self._chat(params["chat_id"]),
            "from": {k: self.bot_user[k] for k in ("id", "is_bot", "first_name", "username")},
        }
        if "message_thread_id" in params:
            message["message_thread_id"] = int(params["message_thread_id"])
        message.update(extra)
        return message

    async def _m_getme(self, params: dict[str, Any]) -> dict[str, Any]:
        return dict(self.bot_user)

    @staticmethod
    def _text(params: dict[str, Any]) -> str:
        text = str(params.get("text") or "")
        if not text:
            raise TelegramApiError(400, "Bad Request: message text is empty")
        if len(text) > MAX_TEXT:
            raise TelegramApiError(400, "Bad Request: message is too long")
        return text

    async def _m_sendmessage(self, params: dict[str, Any]) -> dict[str, Any]:
        text = self._text(params)
        message = self._message(params, text=text)
        self.displayed.posted(message["chat"]["id"], message["message_id"], text)
        return message

    async def _m_editmessagetext(self, params: dict[str, Any]) -> dict[str, Any] | bool:
        """As Telegram: the message must exist, and an edit to the text it shows already is
        an error ("message is not modified")."""
        if "inline_message_id" in params:
            return True
        text = self._text(params)
        chat, message_id = self._chat(params["chat_id"])["id"], int(params["message_id"])
        current = self.displayed.current(chat, message_id)
        if current is None:
            raise TelegramApiError(400, "Bad Request: message to edit not found")
        if current == text:
            raise TelegramApiError(400, NOT_MODIFIED)
        self.displayed.edited(chat, message_id, text)
        return self._message(params, message_id=message_id, text=text,
                             edit_date=int(time.time()))

    async def _m_sendchataction(self, params: dict[str, Any]) -> bool:
        self._chat(params["chat_id"])
        if not params.get("action"):
            raise TelegramApiError(400, "Bad Request: wrong parameter action in request")
        return True

    async def _m_deletemessage(self, params: dict[str, Any]) -> bool:
        return True

    async def _m_answercallbackquery(self, params: dict[str, Any]) -> bool:
        return True

    async def _m_setmycommands(self, params: dict[str, Any]) -> bool:
        return True

    async def _m_setwebhook(self, params: dict[str, Any]) -> bool:
        url = str(params.get("url", ""))
        self.webhook = {k: v for k, v in params.items() if k != "certificate"}
        self.webhook["url"] = url
        if params.get("drop_pending_updates") in (True, "true", "True", "1"):
            self.pending_updates.clear()
        self._notify()
        return True

    async def _m_deletewebhook(self, params: dict[str, Any]) -> bool:
        self.webhook = {"url": ""}
        if params.get("drop_pending_updates") in (True, "true", "True", "1"):
            self.pending_updates.clear()
        return True

    async def _m_getwebhookinfo(self, params: dict[str, Any]) -> dict[str, Any]:
        info: dict[str, Any] = {
            "url": self.webhook_url,
            "has_custom_certificate": False,
            "pending_update_count": len(self.pending_updates),
        }
        for key in ("max_connections", "allowed_updates", "ip_address"):
            if key in self.webhook:
                info[key] = self.webhook[key]
        return info

    async def _m_getupdates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Long polling: returns as soon as updates exist, after ``timeout`` s, or on close.

        A newer getUpdates ends an older pending one with 409 Conflict, as Telegram does.
        """
        if self.webhook_url:
            raise TelegramApiError(
                409,
                "Conflict: can't use getUpdates method while webhook is active; "
                "use deleteWebhook to delete the webhook first",
            )
        offset = int(params.get("offset") or 0)
        limit = max(1, min(100, int(params.get("limit") or 100)))
        timeout = max(0.0, float(params.get("timeout") or 0))
        self._poll_generation += 1
        generation = self._poll_generation
        self._notify()  # ends an older long poll with a conflict
        self._confirm(offset)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            wakeup = self._wakeup
            if generation != self._poll_generation:
                raise TelegramApiError(
                    409,
                    "Conflict: terminated by other getUpdates request; "
                    "make sure that only one bot instance is running",
                )
            batch = self._select(offset, limit)
            if batch or self.closing:
                return batch
            remaining = deadline - loop.time()
            if remaining <= 0 or wakeup is None:
                return []
            try:
                await asyncio.wait_for(wakeup.wait(), remaining)
            except TimeoutError:
                return []

    def _confirm(self, offset: int) -> None:
        """Forget updates confirmed by ``offset`` (>0: ids below it; <0: keep the last -N)."""
        if offset > 0:
            self.pending_updates = [
                u for u in self.pending_updates if int(u["update_id"]) >= offset
            ]
        elif offset < 0:
            self.pending_updates = self.pending_updates[offset:]

    def _select(self, offset: int, limit: int) -> list[dict[str, Any]]:
        if offset > 0:
            chosen = [u for u in self.pending_updates if int(u["update_id"]) >= offset]
        else:
            chosen = list(self.pending_updates)
        return chosen[:limit]

    def get_updates_calls(self) -> list[Call]:
        """The getUpdates calls seen (to check offsets and timeouts)."""
        return self.calls_to("getUpdates")
