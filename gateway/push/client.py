"""An async Python client for the push channel: SSE for speed, the feed for completeness.

It tracks ``(epoch, offset)`` per topic and hands out each row exactly once, in order per
topic. It goes back to ``GET /v1/feed`` when a row skips ahead (offset ≠ last + 1), when the
epoch changes, after every (re)connect, and after ``poll_seconds`` of silence, so a lost
signal, a dropped connection or a server restart costs latency, never a row.

    async with PushClient("http://127.0.0.1:8080", ["pipeline"]) as client:
        async for row in client:
            ...

With an access token and its refresh token (``POST /v1/auth/token`` answers both), a
``TokenRefresher`` keeps the stream going across expiries and revocations of the access
token:

    refresher = TokenRefresher(url, pair["refresh_token"], access_token=pair["access_token"],
                               expires_in=pair["expires_in"], on_rotate=store_refresh_token)
    async with PushClient(url, ["conversation:7"], credential=refresher) as client: ...
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import aiohttp

from gateway.push.protocol import DISCONNECT_EVENT, FeedRow, format_cursor, parse_cursor

log = logging.getLogger("gateway.push.client")


class PushError(RuntimeError):
    """The server refused the stream or the feed (status and JSON error in the message)."""


class AccessRefused(PushError):
    """The server answered 401 (no credential, or one it refuses) or 403 (a credential
    without ``feed:read`` or one of the topics): retrying cannot help, so it stops the
    PushClient (``get()`` raises it). With a refreshing credential (one with
    ``invalidate()``, like ``TokenRefresher``) a 401 is first retried once with a new token.
    ``status`` is the answer's status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class RefreshRefused(Exception):
    """The refresh token was refused (401: expired, revoked, or reused after its rotation):
    only a new login helps. It stops the PushClient: ``get()`` raises it."""


# Disconnect reasons that mean "this access token is done": get another before reconnecting.
CREDENTIAL_ENDED = ("token_expired", "revoked")


class TokenRefresher:
    """A ``credential`` for ``PushClient`` that keeps an access token fresh through
    ``POST /v1/auth/refresh``.

    It holds the refresh token and spends it for the next pair when the access token nears
    its end (a quarter of its life before, at most ``margin_seconds``), and at once after
    the server ended a stream for the token or refused it (``PushClient`` calls
    ``invalidate()``). Every refresh rotates the refresh token: ``on_rotate`` (sync or async)
    gets each new one, for an app that keeps it across restarts. A refused refresh token
    raises ``RefreshRefused``; other failures (network, 429, 5xx) raise ``PushError``, and
    the client tries again after its backoff (a refresh whose answer was lost is answered
    again with the same pair within the server's 10 s grace)."""

    def __init__(self, base_url: str, refresh_token: str, *, access_token: str | None = None,
                 expires_in: float | None = None, margin_seconds: float = 30.0,
                 session: aiohttp.ClientSession | None = None,
                 on_rotate: Callable[[str], object] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.refresh_token = refresh_token
        self.margin_seconds = margin_seconds
        self.on_rotate = on_rotate
        self.refreshes = 0
        self._session = session
        self._access = access_token
        self._refresh_at = (self._deadline(expires_in) if access_token and expires_in
                            else 0.0)
        self._stale = access_token is None
        self._lock = asyncio.Lock()

    def _deadline(self, expires_in: float) -> float:
        return time.monotonic() + expires_in - min(self.margin_seconds, expires_in / 4)

    def invalidate(self) -> None:
        """The server ended or refused the current access token: refresh at the next ask."""
        self._stale = True

    async def __call__(self) -> str:
        async with self._lock:  # one refresh at a time: a second would find the token spent
            if self._stale or self._access is None or time.monotonic() >= self._refresh_at:
                await self._refresh()
            assert self._access is not None
            return self._access

    async def _refresh(self) -> None:
        if self._session is not None:
            body = await self._post(self._session)
        else:  # refreshes are rare: no session to keep open (and close) between them
            async with aiohttp.ClientSession() as session:
                body = await self._post(session)
        self._access, self.refresh_token = str(body["access_token"]), str(body["refresh_token"])
        self._refresh_at = self._deadline(float(body["expires_in"]))
        self._stale = False
        self.refreshes += 1
        if self.on_rotate is not None:
            rotated = self.on_rotate(self.refresh_token)
            if inspect.isawaitable(rotated):
                await rotated

    async def _post(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.post(f"{self.base_url}/v1/auth/refresh",
                                json={"refresh_token": self.refresh_token},
                                timeout=aiohttp.ClientTimeout(total=30)) as resp:
            if resp.status == 401:
                raise RefreshRefused(f"refresh refused: {(await resp.text())[:300]}")
            if resp.status != 200:
                raise PushError(f"refresh answered {resp.status}: {(await resp.text())[:300]}")
            body: dict[str, Any] = await resp.json()
            return body


@dataclass
class _Track:
    epoch: int | None = None
    offset: int | None = None  # None: start live, from wherever the server says the head is


@dataclass
class SseEvent:
    event: str = "message"
    data: str = ""
    id: str | None = None


async def iter_sse(content: aiohttp.StreamReader) -> AsyncIterator[SseEvent | None]:
    """SSE events as they arrive; None for a comment (a heartbeat: the line is alive)."""
    event = SseEvent()
    data: list[str] = []
    async for raw in content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                event.data = "\n".join(data)
                yield event
            event, data = SseEvent(), []
        elif line.startswith(":"):
            yield None
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
            elif name == "event":
                event.event = value
            elif name == "id":
                event.id = value


class PushClient:
    def __init__(self, base_url: str | Sequence[str], topics: Sequence[str], *,
                 since: Mapping[str, int] | str | None = None, poll_seconds: float = 5.0,
                 dead_after_seconds: float = 40.0, page_rows: int = 500,
                 session: aiohttp.ClientSession | None = None,
                 headers: Mapping[str, str] | None = None, buffer_rows: int = 10000,
                 on_trimmed: Callable[[str, int, int], None] | None = None,
                 credential: Callable[[], Awaitable[str]] | None = None) -> None:
        """``credential``: an async function returning the bearer credential to use, asked
        before every connect and feed read (cache and refresh it there): a stream the server
        ends at token expiry or revocation then resumes with a fresh one, from its cursor.
        A ``TokenRefresher`` does that with a refresh token; any credential object with an
        ``invalidate()`` method is told when the server ended a stream for its token or
        answered 401."""
        # Several base URLs (replicas without a balancer in front): the next one after every
        # interruption, so a replica that stops (its streams end with gateway.disconnect)
        # hands its clients to the others.
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("PushClient needs at least one base URL")
        self.base_urls = [url.rstrip("/") for url in urls]
        self._url_index = 0
        self.topics = tuple(dict.fromkeys(topics))
        if isinstance(since, str):
            since = parse_cursor(since)
        self._tracks = {t: _Track(offset=(since or {}).get(t)) for t in self.topics}
        self.poll_seconds = poll_seconds
        self.dead_after_seconds = dead_after_seconds
        self.page_rows = page_rows
        self._session = session
        self._own_session = session is None
        self._headers = dict(headers or {})
        self._credential = credential
        self._on_trimmed = on_trimmed
        self._out: asyncio.Queue[FeedRow] = asyncio.Queue(buffer_rows)
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        # Counters, for tests and for operators who want to know how the client is doing.
        self.connects = 0
        self.gap_fills = 0
        self.lost_to_retention = 0
        self.last_disconnect_reason: str | None = None
        self._retried_refused = False  # a 401 was retried once since the last connect

    # --- public ----------------------------------------------------------------------

    @property
    def positions(self) -> dict[str, int]:
        """The offset of the last row delivered per topic (unknown topics left out)."""
        return {t: tr.offset for t, tr in self._tracks.items() if tr.offset is not None}

    @property
    def cursor(self) -> str:
        return format_cursor(self.positions)

    async def start(self) -> PushClient:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self._task = asyncio.create_task(self._run())
        return self

    # Waits use ``asyncio.timeout``, never ``asyncio.wait_for``: on Python 3.11 wait_for can
    # swallow a cancellation that arrives as its awaitable completes (a row came in just as
    # the block was left, or the caller's own timeout fired), and the client then lives on.

    async def wait_connected(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            await self._connected.wait()

    async def get(self, timeout: float | None = None) -> FeedRow:
        """The next row (waits up to ``timeout`` seconds, then raises TimeoutError); what
        stopped the client (``RefreshRefused``, say) is raised once its rows are taken."""
        task = self._task
        if task is None or not self._out.empty():
            async with asyncio.timeout(timeout):
                return await self._out.get()
        if task.done():
            _raise_end(task)
        getter = asyncio.ensure_future(self._out.get())
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait([getter, task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()  # a row put meanwhile stays in the queue
        if getter.done() and not getter.cancelled():
            return getter.result()
        _raise_end(task)

    def __aiter__(self) -> AsyncIterator[FeedRow]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[FeedRow]:
        while True:
            yield await self.get()

    async def close(self) -> None:
        task = self._task
        while task is not None and not task.done():
            # Again until it ends: a library may turn one cancellation into another error
            # and carry on. (A cancel of close() itself still ends close at this wait.)
            task.cancel()
            await asyncio.wait([task], timeout=1.0)
        if task is not None and not task.cancelled():
            # Marked retrieved, not raised: raising the exception the caller's loop may be
            # raising right now would rewrite its traceback to point here.
            task.exception()
        if self._own_session and self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> PushClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- connection ----------------------------------------------------------------------

    async def _auth(self) -> dict[str, str]:
        if self._credential is None:
            return self._headers
        return {**self._headers, "Authorization": f"Bearer {await self._credential()}"}

    async def _refusal(self, what: str, resp: aiohttp.ClientResponse) -> PushError:
        """The error of a refused stream or feed read; a 401 also tells the credential."""
        body = (await resp.text())[:300]
        if resp.status == 401:
            self._credential_ended()
            return AccessRefused(
                f"{what} answered 401 {body}: no credential, or one the server refuses; "
                "pass headers={'Authorization': 'Bearer <token>'} or credential=...", 401)
        if resp.status == 403:
            return AccessRefused(f"{what} answered 403 {body}: the credential may not read "
                                 "these topics (it needs feed:read and each topic)", 403)
        return PushError(f"{what} answered {resp.status}: {body}")

    def _refreshable(self) -> bool:
        return callable(getattr(self._credential, "invalidate", None))

    def _credential_ended(self) -> None:
        invalidate = getattr(self._credential, "invalidate", None)
        if callable(invalidate):
            invalidate()

    @property
    def base_url(self) -> str:
        return self.base_urls[self._url_index]

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                await self._stream_once()
                backoff = 0.05
            except AccessRefused as exc:
                # Retrying with the same credential cannot help: stop, saying why. A 401
                # with a refreshing credential gets one new token first (it may have ended
                # between our last refresh and the request).
                if exc.status != 401 or not self._refreshable() or self._retried_refused:
                    log.warning("push client stops: %s", exc)
                    raise
                self._retried_refused = True
                log.info("push: credential refused, retrying once with a new one")
            except (aiohttp.ClientError, TimeoutError, PushError, ValueError) as exc:
                log.info("push stream interrupted: %s", exc)
            self._connected.clear()
            self._url_index = (self._url_index + 1) % len(self.base_urls)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, PushError):
                await self._fill_all()  # a reconnect is a possible gap
            await asyncio.sleep(backoff)  # reconnect backoff, not a synchronisation
            backoff = min(backoff * 2, 2.0)

    async def _stream_once(self) -> None:
        assert self._session is not None
        headers = {"Accept": "text/event-stream", **await self._auth()}
        if self.positions:
            headers["Last-Event-ID"] = self.cursor
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None)
        async with self._session.get(f"{self.base_url}/v1/stream",
                                     params={"topics": ",".join(self.topics)},
                                     headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                raise await self._refusal("stream", resp)
            self._adopt_start(resp.headers)
            self.connects += 1
            self._retried_refused = False
            await self._fill_all()  # subscribed first (the server did), now read, then merge
            self._connected.set()
            await self._consume(resp.content)

    def _adopt_start(self, headers: Mapping[str, str]) -> None:
        """Take the server's starting position for live topics and its epochs."""
        offsets = parse_cursor(headers.get("X-Stream-Cursor", ""))
        epochs = parse_cursor(headers.get("X-Stream-Epochs", ""))
        for topic, track in self._tracks.items():
            epoch, offset = epochs.get(topic), offsets.get(topic)
            if epoch is None or offset is None:
                continue
            if track.offset is None:
                track.epoch, track.offset = epoch, offset
            elif track.epoch is None:
                track.epoch = epoch
                track.offset = min(track.offset, offset)  # the server reset a stale cursor
            elif track.epoch != epoch:
                track.epoch, track.offset = epoch, 0

    async def _consume(self, content: aiohttp.StreamReader) -> None:
        # A separate reader task: a timed-out wait on a queue is harmless, whereas cancelling
        # a read inside the SSE parser would end the parser.
        events: asyncio.Queue[SseEvent | BaseException | None] = asyncio.Queue(256)
        reader = asyncio.create_task(_pump(content, events))
        silent = 0.0
        try:
            while True:
                try:
                    async with asyncio.timeout(self.poll_seconds):
                        event = await events.get()
                except TimeoutError:
                    # Silence past a poll interval: maybe signals are lost. Ask the feed.
                    silent += self.poll_seconds
                    if silent >= self.dead_after_seconds:
                        raise TimeoutError(f"no byte from the stream for {silent:g} s") from None
                    await self._fill_all()
                    continue
                silent = 0.0
                if isinstance(event, BaseException):
                    if isinstance(event, _EndOfStream):
                        return
                    raise event
                if event is None:
                    continue
                if event.event == DISCONNECT_EVENT:
                    self.last_disconnect_reason = event.data
                    log.warning("push stream closed by the server: %s", event.data)
                    if _reason(event.data) in CREDENTIAL_ENDED:
                        self._credential_ended()
                    return
                await self._on_row(FeedRow.from_json(json.loads(event.data)))
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    # --- merging ---------------------------------------------------------------------------

    async def _on_row(self, row: FeedRow) -> None:
        track = self._tracks.get(row.topic)
        if track is None or track.offset is None:
            return
        if track.epoch is not None and row.epoch != track.epoch:
            if row.epoch > track.epoch:  # the feed was reset: replay the new epoch from 1
                track.epoch, track.offset = row.epoch, 0
                await self._fill(row.topic)
            return
        track.epoch = row.epoch
        if row.offset <= track.offset:
            return  # seen already
        if row.offset > track.offset + 1:
            await self._fill(row.topic)
            if row.offset <= (track.offset or 0):
                return
        await self._deliver(row)

    async def _deliver(self, row: FeedRow) -> None:
        track = self._tracks[row.topic]
        if track.offset is not None and row.offset > track.offset + 1:
            self._report_trimmed(row.topic, track.offset + 1, row.offset - 1)
        track.offset = row.offset
        await self._out.put(row)

    def _report_trimmed(self, topic: str, first: int, last: int) -> None:
        self.lost_to_retention += last - first + 1
        log.warning("push: %s offsets %d-%d were trimmed by retention before we read them",
                    topic, first, last)
        if self._on_trimmed is not None:
            self._on_trimmed(topic, first, last)

    async def _fill_all(self) -> None:
        for topic in self.topics:
            await self._fill(topic)

    async def _fill(self, topic: str) -> None:
        """Deliver every row after our position from ``GET /v1/feed``."""
        assert self._session is not None
        track = self._tracks[topic]
        if track.offset is None:
            return
        self.gap_fills += 1
        while True:
            async with self._session.get(
                    f"{self.base_url}/v1/feed", headers=await self._auth(),
                    params={"topic": topic, "after": str(track.offset),
                            "limit": str(self.page_rows)},
                    timeout=aiohttp.ClientTimeout(total=30)) as resp:
                if resp.status != 200:
                    raise await self._refusal("feed", resp)
                body = await resp.json()
            epoch = int(body["epoch"])
            if track.epoch is not None and epoch != track.epoch:
                track.epoch, track.offset = epoch, 0
                continue
            track.epoch = epoch
            rows = [FeedRow.from_json(r) for r in body["rows"]]
            for row in rows:
                if row.offset > track.offset:
                    await self._deliver(row)
            if len(rows) < self.page_rows:
                return


def _raise_end(task: asyncio.Task[None]) -> NoReturn:
    """Raise what stopped the client's task (a PushError when it was closed)."""
    if not task.cancelled():
        task.result()
    raise PushError("the client is closed" if task.cancelled() else "the client has stopped")


def _reason(data: str) -> str | None:
    """The ``reason`` of a ``gateway.disconnect`` event's data."""
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(data).get("reason"))
    return None


class _EndOfStream(Exception):
    """The server closed the stream."""


async def _pump(content: aiohttp.StreamReader,
                events: asyncio.Queue[SseEvent | BaseException | None]) -> None:
    try:
        async for event in iter_sse(content):
            await events.put(event)
        await events.put(_EndOfStream())
    except Exception as exc:  # handed to the consumer, which reconnects
        await events.put(exc)
