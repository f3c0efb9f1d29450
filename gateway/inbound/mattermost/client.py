"""A small Mattermost API v4 client on aiohttp: the few REST calls the listener needs and the
WebSocket event stream.

Why not a driver: mattermostdriver (archived, last release 2022) breaks on ``wss://`` with
Python >= 3.10 and reconnects in a hot loop; mattermostautodriver shares that WebSocket loop
(no backoff, ``disconnect()`` does not stop it) and pulls in httpx. The gateway needs five REST
calls and one socket, and owns reconnects, backoff and catch-up itself (see
``listener.py``), so a thin client on the aiohttp we already run is the smaller risk.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.outbound.chat import NOTIFICATION_EVENT

log = logging.getLogger("gateway.mattermost")


class MattermostError(Exception):
    """The server answered an error (``status`` is its HTTP status, ``error_id`` its code)."""

    def __init__(self, status: int, error_id: str, message: str) -> None:
        super().__init__(f"{status} {error_id}: {message}")
        self.status = status
        self.error_id = error_id


class RateLimited(MattermostError):
    """HTTP 429; ``retry_after`` seconds come from the server's ``Retry-After``."""

    def __init__(self, retry_after: float, error_id: str, message: str) -> None:
        super().__init__(429, error_id, message)
        self.retry_after = retry_after


class SocketClosed(Exception):
    """The event stream ended: close frame (``code``), abort, or a failed authentication."""

    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(f"{reason} (close code {code})")
        self.code = code


REPLY_TO_PROP = "gateway_reply_to"


@dataclass(frozen=True)
class Post:
    """The fields of a Mattermost post the gateway uses."""

    id: str
    channel_id: str
    user_id: str
    message: str
    root_id: str
    create_at: int
    type: str = ""
    delete_at: int = 0
    user_name: str = ""  # filled in by the listener (one cached lookup per author)
    reply_to: str = ""  # props.gateway_reply_to: the post a gateway reply answers
    mark: str = ""  # props.gateway_notification: the mark of a notification the gateway posted

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Post:
        def text(name: str) -> str:
            return str(data.get(name) or "")

        props = data.get("props")
        props = props if isinstance(props, dict) else {}
        reply_to, mark = props.get(REPLY_TO_PROP), props.get(NOTIFICATION_EVENT)
        return cls(id=str(data["id"]), channel_id=str(data["channel_id"]),
                   user_id=text("user_id"), message=text("message"), root_id=text("root_id"),
                   create_at=int(data.get("create_at") or 0), type=text("type"),
                   delete_at=int(data.get("delete_at") or 0),
                   reply_to=reply_to if isinstance(reply_to, str) else "",
                   mark=mark if isinstance(mark, str) else "")


def posted_post(event: dict[str, Any]) -> Post | None:
    """The post of a ``posted`` event; Mattermost sends ``data.post`` as a JSON *string*."""
    if event.get("event") != "posted":
        return None
    raw = (event.get("data") or {}).get("post")
    try:
        data = json.loads(raw) if isinstance(raw, str) else raw
        return Post.from_api(data) if isinstance(data, dict) else None
    except (ValueError, KeyError, TypeError):
        log.warning("mattermost: malformed posted event ignored")
        return None


class MattermostClient:
    """REST under ``{url}/api/v4`` with a bot token, and the authenticated event socket."""

    def __init__(self, url: str, token: str, session: aiohttp.ClientSession,
                 *, timeout: float = 30.0) -> None:
        root = url.rstrip("/")
        self.api = f"{root}/api/v4"
        self.ws_url = ("ws" + root[4:] if root.startswith("http") else root) + "/api/v4/websocket"
        self._token = token
        self._session = session
        self._headers = {"Authorization": f"Bearer {token}"}
        # Per REST call: the session itself has no total timeout, which would cut the socket.
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        async with self._session.request(method, self.api + path, headers=self._headers,
                                         timeout=self._timeout, **kwargs) as resp:
            try:  # content_type=None: accept JSON whatever the exact Content-Type says
                body = await resp.json(content_type=None)
            except ValueError:  # an HTML error page from a proxy, say
                body = None
            if resp.status < 400:
                return body
            error_id = str((body or {}).get("id", "")) if isinstance(body, dict) else ""
            message = str((body or {}).get("message", "")) if isinstance(body, dict) else ""
            if resp.status == 429:
                retry = resp.headers.get("Retry-After") or resp.headers.get("X-Ratelimit-Reset")
                raise RateLimited(float(retry or 1), error_id, message)
            raise MattermostError(resp.status, error_id, message)

    async def me(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", "/users/me")
        return result

    async def user(self, user_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", f"/users/{user_id}")
        return result

    async def my_channel_ids(self) -> list[str]:
        """Every channel the bot is a member of, across teams."""
        channels = await self._call("GET", "/users/me/channels")
        return [str(c["id"]) for c in channels or []]

    async def posts_since(self, channel_id: str, since_ms: int) -> list[Post]:
        """Posts of one channel created or updated after ``since_ms``, oldest first."""
        page = await self._call("GET", f"/channels/{channel_id}/posts",
                                params={"since": str(max(0, since_ms))})
        posts = [Post.from_api(p) for p in (page or {}).get("posts", {}).values()]
        return sorted(posts, key=lambda p: p.create_at)

    async def create_post(self, channel_id: str, message: str, root_id: str | None = None,
                          reply_to: str | None = None, mark: str | None = None
                          ) -> dict[str, Any]:
        """``reply_to`` (the post answered) or ``mark`` (a notification's) is kept in the
        post's props, so a successor can see on the platform itself that it was posted."""
        body: dict[str, Any] = {"channel_id": channel_id, "message": message,
                                "root_id": root_id or ""}
        if reply_to:
            body["props"] = {REPLY_TO_PROP: reply_to}
        if mark:
            body["props"] = {NOTIFICATION_EVENT: mark}
        result: dict[str, Any] = await self._call("POST", "/posts", json=body)
        return result

    async def patch_post(self, post_id: str, message: str) -> dict[str, Any]:
        """Replace a post's message (``PUT /posts/{id}/patch``; the bot's own posts only)."""
        result: dict[str, Any] = await self._call("PUT", f"/posts/{post_id}/patch",
                                                  json={"message": message})
        return result

    async def typing(self, channel_id: str, parent_id: str | None = None) -> None:
        """The "is typing" indicator in a channel (thread), for the bot itself (server 5.26+;
        the REST form, so a consumer needs no socket of its own)."""
        await self._call("POST", "/users/me/typing",
                         json={"channel_id": channel_id, "parent_id": parent_id or ""})

    @asynccontextmanager
    async def events(self, heartbeat: float) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """Connect and authenticate (challenge with ``seq`` 1); yield the stream of events.

        The stream raises ``SocketClosed`` when the socket ends for any reason, so the caller
        has one place to reconnect from. ``heartbeat`` pings detect a silently dead peer.
        """
        async with self._session.ws_connect(self.ws_url, heartbeat=heartbeat,
                                            max_msg_size=0) as ws:
            await ws.send_json({"seq": 1, "action": "authentication_challenge",
                                "data": {"token": self._token}})
            yield _stream(ws)


async def _stream(ws: aiohttp.ClientWebSocketResponse) -> AsyncIterator[dict[str, Any]]:
    async for msg in ws:
        if msg.type != aiohttp.WSMsgType.TEXT:
            break
        try:
            event = json.loads(msg.data)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("seq_reply") == 1 and event.get("status") != "OK":
            raise SocketClosed(f"authentication failed: {event.get('error')}", ws.close_code)
        if "event" in event:
            yield event
    raise SocketClosed("socket closed", ws.close_code)
