"""Fake Mattermost server (REST API v4 subset + WebSocket) for tests.

Lets the gateway's Mattermost listener run offline against a real server on
127.0.0.1: log in, enumerate channels, receive ``posted`` events over the
WebSocket, reply through REST, and survive dropped, killed or refused sockets.
Pass ``fake.url`` as ``MATTERMOST_URL`` (the gateway appends ``/api/v4``).

REST (all under ``/api/v4``; everything except login/websocket needs
``Authorization: Bearer <token>``; JSON answers have ``Content-Type:
application/json`` exactly, because the Mattermost drivers compare it literally):

- ``POST /users/login`` ``{"login_id", "password"}`` → the bot user, session token in
  the ``Token`` response header (the configured ``token`` works without login too).
- ``GET /users/me`` → the bot user; ``GET /users/{id}`` → any known user.
- ``POST /posts`` ``{"channel_id", "message", "root_id"?, "props"?}`` → 201 post;
  recorded in ``replies()`` and, like real Mattermost, echoed to sockets as a
  ``posted`` event (``echo_own_posts=False`` turns that off).
- ``PUT /posts/{id}/patch`` ``{"message"}`` edits the bot's own post (``post_edited`` to
  sockets); ``POST /users/{id}/typing`` ``{"channel_id", "parent_id"?}`` (the typing
  indicator). ``shown(channel)`` gives what each bot post showed over time.
- ``GET /channels/{id}/posts?since=<ms>`` → ``{"order": [ids newest first], "posts": {id: post}}``
  with posts updated after ``since`` (without it: ``page``/``per_page``, newest first).
- Channel enumeration, pick either route: ``GET /users/me/teams`` then
  ``GET /users/me/teams/{team_id}/channels`` per team, or ``GET /users/me/channels``
  (all the bot's channels across teams). ``GET /channels/{id}`` → one channel.
- ``GET /websocket``: the client sends
  ``{"seq": 1, "action": "authentication_challenge", "data": {"token": T}}``; the
  server answers ``{"status": "OK", "seq_reply": 1}`` then ``{"event": "hello", ...}``.
  A bad token gets ``{"status": "FAIL", "seq_reply": 1, "error": {...}}`` and the socket
  is closed with code 1008.  A valid ``Authorization`` header on the upgrade
  request authenticates at once (hello sent immediately).  ``posted`` events carry
  ``data.post`` as a JSON *string*, as Mattermost does.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes.base import FakeServer, Fault, json_response, read_params

__all__ = ["BOT_USER_ID", "HUMAN_USER_ID", "TEAM_ID", "FakeMattermost"]

BOT_USER_ID = "botuser0000000000000000000"
HUMAN_USER_ID = "humanuser00000000000000000"
TEAM_ID = "team0000000000000000000000"
SERVER_VERSION = "9.11.0.9.11.0.fake.false"
MAX_MESSAGE = 16383  # characters of one post (the server's default maximum)


def new_id() -> str:
    """A 26-character lowercase id like Mattermost's."""
    return uuid.uuid4().hex[:26]


@dataclass(eq=False)
class _Socket:
    """One accepted WebSocket connection."""

    ws: web.WebSocketResponse
    request: web.Request
    authenticated: bool = False
    seq: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)

    def next_seq(self) -> int:
        seq = self.seq
        self.seq += 1
        return seq


class FakeMattermost(FakeServer):
    """In-memory Mattermost: one team, a few channels, posts, and live WebSockets.

    Counters: ``ws_attempts`` (upgrade requests, refused ones included),
    ``ws_connections`` (accepted), ``ws_authenticated``, ``ws_auth_failures``,
    ``open_sockets`` (currently open and authenticated).
    """

    #: seconds a server-side ``ws.close()`` waits for the client's close frame
    ws_close_timeout: float = 2.0

    def __init__(
        self,
        token: str = "mm-test-token",
        *,
        login_id: str = "gateway-bot",
        password: str = "bot-password",
        bot_user_id: str = BOT_USER_ID,
        bot_username: str = "gateway-bot",
        team_id: str = TEAM_ID,
        team_name: str = "fake-team",
        channels: Iterable[str] = ("general", "random"),
        echo_own_posts: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port)
        self.token = token
        self.login_id = login_id
        self.password = password
        self.echo_own_posts = echo_own_posts
        # While true, POST /posts stores the post and then never answers (until close): a
        # client that dies waiting has posted without knowing it.
        self.stall_created_posts = False
        self.valid_tokens: set[str] = {token}
        self.bot_user = self._user(bot_user_id, bot_username, is_bot=True)
        self.users: dict[str, dict[str, Any]] = {
            bot_user_id: self.bot_user,
            HUMAN_USER_ID: self._user(HUMAN_USER_ID, "alice"),
        }
        self.team: dict[str, Any] = {
            "id": team_id,
            "name": team_name,
            "display_name": team_name.title(),
            "type": "O",
            "create_at": self._now_ms(),
            "update_at": self._now_ms(),
            "delete_at": 0,
        }
        self.channels: dict[str, dict[str, Any]] = {}
        #: channel ids the bot is a member of
        self.memberships: set[str] = set()
        for channel_id in channels:
            self.add_channel(channel_id)
        #: every post, by id (insertion order = creation order)
        self.posts: dict[str, dict[str, Any]] = {}
        self._last_ms = 0
        self.sockets: list[_Socket] = []
        self.accepting = True
        self.ws_attempts = 0
        self.ws_connections = 0
        self.ws_authenticated = 0
        self.ws_auth_failures = 0
        #: every JSON message received from any WebSocket client, in order
        self.ws_messages: list[dict[str, Any]] = []

    # helpers for building state -----------------------------------------------
    @staticmethod
    def _now_ms() -> int:
        return int(time.time() * 1000)

    def _tick_ms(self) -> int:
        """Strictly increasing millisecond clock so ``since`` queries are unambiguous."""
        self._last_ms = max(self._now_ms(), self._last_ms + 1)
        return self._last_ms

    @staticmethod
    def _user(user_id: str, username: str, *, is_bot: bool = False) -> dict[str, Any]:
        user: dict[str, Any] = {
            "id": user_id,
            "username": username,
            "email": f"{username}@example.invalid",
            "first_name": "",
            "last_name": "",
            "nickname": "",
            "roles": "system_user",
            "locale": "en",
            "create_at": 0,
            "update_at": 0,
            "delete_at": 0,
        }
        if is_bot:
            user["is_bot"] = True
        return user

    def add_user(self, user_id: str, username: str) -> dict[str, Any]:
        """Register another (human) user that can author posts."""
        self.users[user_id] = self._user(user_id, username)
        return self.users[user_id]

    def add_channel(
        self,
        channel_id: str,
        *,
        name: str | None = None,
        display_name: str | None = None,
        channel_type: str = "O",
        member: bool = True,
    ) -> dict[str, Any]:
        """Create a channel (type ``"O"`` open, ``"P"`` private, ``"D"`` direct).

        The bot is a member (so the channel is listed) when ``member`` is true.
        """
        now = self._now_ms()
        channel = {
            "id": channel_id,
            "team_id": "" if channel_type in ("D", "G") else self.team["id"],
            "type": channel_type,
            "name": name or channel_id,
            "display_name": display_name or (name or channel_id).title(),
            "header": "",
            "purpose": "",
            "create_at": now,
            "update_at": now,
            "delete_at": 0,
            "last_post_at": 0,
            "total_msg_count": 0,
            "creator_id": "",
        }
        self.channels[channel_id] = channel
        if member:
            self.memberships.add(channel_id)
        return channel

    # public API ------------------------------------------------------------
    @property
    def api_url(self) -> str:
        """REST root ``{url}/api/v4`` (``MATTERMOST_URL`` itself is ``url``)."""
        return f"{self.url}/api/v4"

    @property
    def ws_url(self) -> str:
        """``ws://127.0.0.1:<port>/api/v4/websocket``."""
        return f"ws://{self.host}:{self.port}/api/v4/websocket"

    @property
    def open_sockets(self) -> int:
        """Open, authenticated WebSocket connections right now."""
        return sum(1 for s in self.sockets if s.authenticated and not s.ws.closed)

    def set_accepting(self, accepting: bool) -> None:
        """While ``False``, WebSocket upgrades are refused with HTTP 503 (REST still works)."""
        self.accepting = accepting

    def replies(self, channel_id: str | None = None) -> list[dict[str, Any]]:
        """Posts created through ``POST /api/v4/posts`` (the bot's replies), oldest first."""
        return [
            c.params["_post"]
            for c in self.calls_to("create_post")
            if "_post" in c.params
            and (channel_id is None or c.params["_post"]["channel_id"] == channel_id)
        ]

    def reply_messages(self, channel_id: str | None = None) -> list[str]:
        """Just the ``message`` of ``replies``."""
        return [str(p["message"]) for p in self.replies(channel_id)]

    def shown(self, channel_id: str) -> list[list[str]]:
        """Per bot post in the channel, oldest first: the message it was created with, then
        the message of each successful patch."""
        return self.displayed.in_chat(channel_id)

    def patches(self, channel_id: str | None = None) -> list[dict[str, Any]]:
        """Params of every ``PUT /posts/{id}/patch`` (``_post_id`` is the post's id)."""
        return [
            c.params
            for c in self.calls_to("patch_post")
            if channel_id is None
            or self.posts.get(str(c.params.get("_post_id")), {}).get("channel_id") == channel_id
        ]

    def typing_calls(self, channel_id: str | None = None) -> list[dict[str, Any]]:
        """Params of every ``POST /users/{id}/typing`` (``channel_id``, ``parent_id``)."""
        return [
            c.params
            for c in self.calls_to("typing")
            if channel_id is None or c.params.get("channel_id") == channel_id
        ]

    async def wait_for_sockets(self, count: int = 1, timeout: float = 5.0) -> None:
        """Wait until ``count`` authenticated sockets are open, so pushes reach a listener."""
        await self.wait_for(
            lambda: self.open_sockets >= count,
            timeout=timeout,
            message=f"{count} authenticated websocket(s); open={self.open_sockets} "
            f"attempts={self.ws_attempts} failures={self.ws_auth_failures}",
        )

    async def wait_for_connections(self, count: int, timeout: float = 5.0) -> None:
        """Wait until ``ws_connections`` (accepted upgrades, ever) reaches ``count``."""
        await self.wait_for(
            lambda: self.ws_connections >= count,
            timeout=timeout,
            message=f"{count} websocket connections; saw {self.ws_connections}",
        )

    async def wait_for_replies(
        self, count: int = 1, channel_id: str | None = None, timeout: float = 5.0
    ) -> list[dict[str, Any]]:
        """Wait until the bot created at least ``count`` posts (in ``channel_id``); return them."""
        return await self.wait_for_count(
            lambda: self.replies(channel_id), count, timeout, f"{count} replies in {channel_id}")

    def fail_next(
        self, endpoint: str, status: int = 429, retry_after: int = 1, count: int = 1
    ) -> None:
        """Answer the next ``count`` requests to ``endpoint`` (``"*"``: any) with an error.

        Endpoint names: ``login``, ``get_user``, ``create_post``, ``channel_posts``,
        ``get_channel``, ``teams``, ``team_channels``, ``user_channels``, ``patch_post``,
        ``typing``, ``websocket``
        (the upgrade is refused with that status).  The body is Mattermost's AppError
        shape; 429 adds ``Retry-After`` and ``X-Ratelimit-*`` headers.
        """
        self._queue_fault(
            endpoint,
            Fault(
                status=status, retry_after=retry_after if status == 429 else None, remaining=count
            ),
        )

    def slow(self, endpoint: str, seconds: float, *, count: int = 1) -> None:
        """The next ``count`` requests to ``endpoint`` (names as ``fail_next``) are answered
        as usual, ``seconds`` late."""
        self._queue_fault(endpoint, Fault(status=0, delay=seconds, remaining=count))

    def make_post(
        self,
        channel_id: str,
        message: str,
        *,
        user_id: str = HUMAN_USER_ID,
        post_id: str | None = None,
        root_id: str = "",
        props: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Store a post without pushing it (for REST catch-up tests); returns it."""
        if channel_id not in self.channels:
            self.add_channel(channel_id)
        now = self._tick_ms()
        post: dict[str, Any] = {
            "id": post_id or new_id(),
            "create_at": now,
            "update_at": now,
            "edit_at": 0,
            "delete_at": 0,
            "is_pinned": False,
            "user_id": user_id,
            "channel_id": channel_id,
            "root_id": root_id,
            "original_id": "",
            "message": message,
            "type": "",
            "props": dict(props or {}),
            "hashtags": "",
            "pending_post_id": "",
            "reply_count": 0,
            "metadata": {},
        }
        self.posts[post["id"]] = post
        self.channels[channel_id]["last_post_at"] = now
        return post

    async def create_post(
        self,
        channel_id: str,
        message: str,
        user_id: str = HUMAN_USER_ID,
        post_id: str | None = None,
        *,
        root_id: str = "",
        props: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Store a post, push ``posted`` to every authenticated socket, return the post."""
        post = self.make_post(
            channel_id, message, user_id=user_id, post_id=post_id, root_id=root_id, props=props
        )
        await self.push_posted(post)
        return post

    async def redeliver(self, post_id: str) -> int:
        """Push an existing post's ``posted`` event again (a duplicate delivery).

        Returns the number of sockets reached.
        """
        return await self.push_posted(self.posts[post_id])

    async def push_posted(self, post: Mapping[str, Any]) -> int:
        """Push ``posted`` for ``post`` (``data.post`` JSON-encoded); returns sockets reached."""
        channel = self.channels.get(str(post["channel_id"]), {})
        sender = self.users.get(str(post["user_id"]), {}).get("username", "unknown")
        data = {
            "channel_display_name": channel.get("display_name", ""),
            "channel_name": channel.get("name", ""),
            "channel_type": channel.get("type", "O"),
            "post": json.dumps(dict(post)),
            "sender_name": f"@{sender}",
            "set_online": True,
            "team_id": channel.get("team_id", ""),
        }
        broadcast = {
            "omit_users": None,
            "user_id": "",
            "channel_id": post["channel_id"],
            "team_id": "",
        }
        return await self.push_event("posted", data, broadcast)

    async def push_event(
        self, event: str, data: Mapping[str, Any], broadcast: Mapping[str, Any] | None = None
    ) -> int:
        """Send ``{"event", "data", "broadcast", "seq"}`` to live sockets; returns count."""
        sent = 0
        for sock in list(self.sockets):
            if not sock.authenticated or sock.ws.closed:
                continue
            payload = {
                "event": event,
                "data": dict(data),
                "broadcast": dict(
                    broadcast
                    or {"omit_users": None, "user_id": "", "channel_id": "", "team_id": ""}
                ),
                "seq": sock.next_seq(),
            }
            try:
                await sock.ws.send_str(json.dumps(payload))
            except (ConnectionError, RuntimeError):
                continue
            sent += 1
        return sent

    async def drop_sockets(self, code: int = 1000, message: str = "") -> int:
        """Close every open socket with a close frame carrying ``code``; returns how many."""
        targets = [s for s in self.sockets if not s.ws.closed]
        await asyncio.gather(
            *(s.ws.close(code=code, message=message.encode()) for s in targets),
            return_exceptions=True,
        )
        return len(targets)

    def kill_sockets(self) -> int:
        """Abort every socket's TCP transport without a close frame (a crash or network cut)."""
        killed = 0
        for sock in list(self.sockets):
            transport = sock.request.transport
            if transport is not None and not transport.is_closing():
                transport.abort()
                killed += 1
        return killed

    # server ----------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_middleware])
        r = app.router
        r.add_post("/api/v4/users/login", self._login)
        r.add_get("/api/v4/websocket", self._websocket)
        r.add_get("/api/v4/users/{user_id}/teams", self._teams)
        r.add_get("/api/v4/users/{user_id}/teams/{team_id}/channels", self._team_channels)
        r.add_get("/api/v4/users/{user_id}/channels", self._user_channels)
        r.add_get("/api/v4/users/{user_id}", self._get_user)
        r.add_post("/api/v4/posts", self._create_post)
        r.add_put("/api/v4/posts/{post_id}/patch", self._patch_post)
        r.add_post("/api/v4/users/{user_id}/typing", self._typing)
        r.add_get("/api/v4/channels/{channel_id}/posts", self._channel_posts)
        r.add_get("/api/v4/channels/{channel_id}", self._get_channel)
        return app

    async def _on_shutdown(self, app: web.Application) -> None:
        await super()._on_shutdown(app)
        await self.drop_sockets(1001, "server shutting down")

    @staticmethod
    def _app_error(
        status: int, error_id: str, message: str, headers: Mapping[str, str] | None = None
    ) -> web.Response:
        body = {
            "id": error_id,
            "message": message,
            "detailed_error": "",
            "request_id": new_id(),
            "status_code": status,
        }
        return json_response(body, status=status, headers=headers)

    def _fault_response(self, fault: Fault) -> web.Response:
        headers: dict[str, str] = {}
        if fault.status == 429:
            retry = str(fault.retry_after or 1)
            headers = {
                "Retry-After": retry,
                "X-Ratelimit-Limit": "10",
                "X-Ratelimit-Remaining": "0",
                "X-Ratelimit-Reset": retry,
            }
            return self._app_error(
                429, "api.context.rate_limit.app_error", "limit exceeded", headers
            )
        return self._app_error(fault.status, "api.injected_fault.app_error", "injected fault")

    def _token_of(self, request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            return auth[7:].strip()
        if auth[:6].lower() == "token ":
            return auth[6:].strip()
        return request.cookies.get("MMAUTHTOKEN")

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Require a valid token on everything but login and the websocket upgrade."""
        if request.path in ("/api/v4/users/login", "/api/v4/websocket"):
            return await handler(request)
        if self._token_of(request) not in self.valid_tokens:
            params = await read_params(request)
            self.record(
                "unauthorized",
                {"path": request.path, **params},
                request,
                token=self._token_of(request),
            )
            return self._app_error(
                401,
                "api.context.session_expired.app_error",
                "Invalid or expired session, please login again.",
            )
        response: web.StreamResponse = await handler(request)
        return response

    async def _begin(
        self, endpoint: str, request: web.Request
    ) -> tuple[dict[str, Any], web.Response | None]:
        """Record the call and return (params, fault response or None)."""
        params = await read_params(request)
        params.update({f"_{k}": v for k, v in request.match_info.items()})
        self.record(endpoint, params, request, token=self._token_of(request))
        fault = self.take_fault(endpoint)
        if fault is not None and not fault.status:  # only slow: answered as usual after it
            await asyncio.sleep(fault.delay)
            fault = None
        return params, (self._fault_response(fault) if fault is not None else None)

    def _resolve_user(self, user_id: str) -> str:
        return self.bot_user["id"] if user_id == "me" else user_id

    async def _login(self, request: web.Request) -> web.Response:
        params, failed = await self._begin("login", request)
        if failed:
            return failed
        if params.get("login_id") != self.login_id or params.get("password") != self.password:
            return self._app_error(
                401,
                "api.user.login.invalid_credentials_email_username",
                "Enter a valid email or username and/or password.",
            )
        session = f"sess{new_id()}"
        self.valid_tokens.add(session)
        return json_response(self.bot_user, headers={"Token": session})

    async def _get_user(self, request: web.Request) -> web.Response:
        _, failed = await self._begin("get_user", request)
        if failed:
            return failed
        user = self.users.get(self._resolve_user(request.match_info["user_id"]))
        if user is None:
            return self._app_error(
                404, "app.user.missing_account.const", "Unable to find the user."
            )
        return json_response(user)

    async def _teams(self, request: web.Request) -> web.Response:
        _, failed = await self._begin("teams", request)
        return failed or json_response([self.team])

    def _member_channels(self, team_id: str | None = None) -> list[dict[str, Any]]:
        return [
            c
            for cid, c in self.channels.items()
            if cid in self.memberships and (team_id is None or c["team_id"] in (team_id, ""))
        ]

    async def _team_channels(self, request: web.Request) -> web.Response:
        _, failed = await self._begin("team_channels", request)
        if failed:
            return failed
        team_id = request.match_info["team_id"]
        if team_id != self.team["id"]:
            return self._app_error(
                404, "app.team.get.find.app_error", "Unable to find the existing team."
            )
        return json_response(self._member_channels(team_id))

    async def _user_channels(self, request: web.Request) -> web.Response:
        _, failed = await self._begin("user_channels", request)
        return failed or json_response(self._member_channels())

    async def _get_channel(self, request: web.Request) -> web.Response:
        _, failed = await self._begin("get_channel", request)
        if failed:
            return failed
        channel = self.channels.get(request.match_info["channel_id"])
        if channel is None:
            return self._app_error(
                404, "app.channel.get.existing.app_error", "Unable to find the existing channel."
            )
        return json_response(channel)

    async def _create_post(self, request: web.Request) -> web.Response:
        params, failed = await self._begin("create_post", request)
        if failed:
            return failed
        channel_id = str(params.get("channel_id") or "")
        if channel_id not in self.channels:
            return self._app_error(
                400, "api.context.invalid_body_param.app_error", "Invalid channel_id."
            )
        if not params.get("message") and not params.get("file_ids"):
            return self._app_error(
                400, "api.context.invalid_body_param.app_error", "Invalid message."
            )
        post = self.make_post(
            channel_id,
            str(params.get("message", "")),
            user_id=self.bot_user["id"],
            root_id=str(params.get("root_id") or ""),
            props=params.get("props"),
        )
        if params.get("pending_post_id"):
            post["pending_post_id"] = params["pending_post_id"]
        params["_post"] = post
        self.displayed.posted(channel_id, post["id"], post["message"])
        if self.echo_own_posts:
            await self.push_posted(post)
        if self.stall_created_posts and self._closing is not None:
            await self._closing.wait()
        return json_response(post, status=201)

    async def _patch_post(self, request: web.Request) -> web.Response:
        """Edit a post's message (only the author's own): ``update_at``/``edit_at`` move and
        sockets get ``post_edited``, as Mattermost does."""
        params, failed = await self._begin("patch_post", request)
        if failed:
            return failed
        post = self.posts.get(request.match_info["post_id"])
        if post is None or post["delete_at"]:
            return self._app_error(404, "app.post.get.app_error", "Unable to get the post.")
        if post["user_id"] != self.bot_user["id"]:
            return self._app_error(
                403, "api.context.permissions.app_error", "You do not have the permission."
            )
        if "message" in params:
            message = str(params["message"])
            if len(message) > MAX_MESSAGE:
                return self._app_error(
                    400, "model.post.is_valid.message_length.app_error", "Message too long."
                )
            now = self._tick_ms()
            post.update(message=message, update_at=now, edit_at=now)
            self.displayed.edited(post["channel_id"], post["id"], message)
            await self.push_event("post_edited", {"post": json.dumps(post)},
                                  {"channel_id": post["channel_id"]})
        return json_response(post)

    async def _typing(self, request: web.Request) -> web.Response:
        """``POST /users/{id}/typing``: only for oneself (``me`` or the bot's own id)."""
        params, failed = await self._begin("typing", request)
        if failed:
            return failed
        if self._resolve_user(request.match_info["user_id"]) != self.bot_user["id"]:
            return self._app_error(
                403, "api.context.permissions.app_error", "You do not have the permission."
            )
        if str(params.get("channel_id") or "") not in self.channels:
            return self._app_error(
                400, "api.context.invalid_body_param.app_error", "Invalid channel_id."
            )
        return json_response({"status": "OK"})

    async def _channel_posts(self, request: web.Request) -> web.Response:
        params, failed = await self._begin("channel_posts", request)
        if failed:
            return failed
        channel_id = request.match_info["channel_id"]
        if channel_id not in self.channels:
            return self._app_error(
                404, "app.channel.get.existing.app_error", "Unable to find the existing channel."
            )
        posts = [
            p for p in self.posts.values() if p["channel_id"] == channel_id and not p["delete_at"]
        ]
        if params.get("since"):
            since = int(params["since"])
            chosen = [p for p in posts if p["update_at"] > since or p["create_at"] > since]
        else:
            page, per_page = int(params.get("page") or 0), int(params.get("per_page") or 60)
            newest_first = sorted(posts, key=lambda p: p["create_at"], reverse=True)
            chosen = newest_first[page * per_page : (page + 1) * per_page]
        chosen.sort(key=lambda p: p["create_at"], reverse=True)
        return json_response(
            {
                "order": [p["id"] for p in chosen],
                "posts": {p["id"]: p for p in chosen},
                "next_post_id": "",
                "prev_post_id": "",
                "has_next": False,
            }
        )

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        self.ws_attempts += 1
        fault = self.take_fault("websocket")
        if fault is not None:
            return self._fault_response(fault)
        if not self.accepting or self.closing:
            return self._app_error(
                503, "api.web_socket.connect.unavailable", "Service unavailable."
            )
        ws = web.WebSocketResponse(timeout=self.ws_close_timeout, autoping=True)
        await ws.prepare(request)
        sock = _Socket(ws=ws, request=request)
        self.sockets.append(sock)
        self.ws_connections += 1
        try:
            if self._token_of(request) in self.valid_tokens:
                await self._authenticate(sock)
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    data = json.loads(msg.data)
                except ValueError:
                    continue
                if not isinstance(data, dict):
                    continue
                sock.received.append(data)
                self.ws_messages.append(data)
                if not await self._ws_action(sock, data):
                    break
        finally:
            self.sockets.remove(sock)
        return ws

    async def _authenticate(self, sock: _Socket) -> None:
        """Send hello, then mark the socket as receiving broadcasts."""
        hello = {
            "event": "hello",
            "data": {
                "server_version": SERVER_VERSION,
                "connection_id": new_id(),
                "server_hostname": "fake",
            },
            "broadcast": {
                "omit_users": None,
                "user_id": self.bot_user["id"],
                "channel_id": "",
                "team_id": "",
            },
            "seq": sock.next_seq(),
        }
        await sock.ws.send_str(json.dumps(hello))
        if not sock.authenticated:
            sock.authenticated = True
            self.ws_authenticated += 1

    async def _ws_action(self, sock: _Socket, data: dict[str, Any]) -> bool:
        """Answer one client action; returns False when the socket should be closed."""
        action = data.get("action")
        seq = data.get("seq")
        if action == "authentication_challenge":
            token = (data.get("data") or {}).get("token")
            if token not in self.valid_tokens:
                self.ws_auth_failures += 1
                await sock.ws.send_str(
                    json.dumps(
                        {
                            "status": "FAIL",
                            "seq_reply": seq,
                            "error": {
                                "id": "api.web_socket_router.not_authenticated.app_error",
                                "message": "Invalid or expired session",
                                "status_code": 401,
                            },
                        }
                    )
                )
                await sock.ws.close(code=1008, message=b"authentication failed")
                return False
            await sock.ws.send_str(json.dumps({"status": "OK", "seq_reply": seq}))
            if not sock.authenticated:
                await self._authenticate(sock)
            return True
        if not sock.authenticated:
            await sock.ws.send_str(
                json.dumps(
                    {
                        "status": "FAIL",
                        "seq_reply": seq,
                        "error": {
                            "id": "api.web_socket_router.not_authenticated.app_error",
                            "message": "not authenticated",
                            "status_code": 401,
                        },
                    }
                )
            )
            return True
        reply: dict[str, Any] = {"status": "OK", "seq_reply": seq}
        if action == "ping":
            reply["data"] = {
                "text": "pong",
                "version": SERVER_VERSION,
                "server_time": self._now_ms(),
            }
        await sock.ws.send_str(json.dumps(reply))
        return True
