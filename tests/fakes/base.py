"""Shared plumbing for the fake platform servers.

Every fake is a real aiohttp server on 127.0.0.1 with a free port, so the
gateway and the real client libraries talk to it over loopback exactly as they
would to the platform.  This module holds what all fakes share: start/stop,
the call log, fault injection and deadline-bounded waiting.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, TypeVar, overload

from aiohttp import web

from tests.fakes.waiting import wait_until

T = TypeVar("T")

__all__ = ["Call", "Displayed", "FakeServer", "Fault", "decode_form_values", "json_response"]


@dataclass(frozen=True)
class Call:
    """One request the fake received: API method name, decoded params, when, auth, headers."""

    method: str
    params: dict[str, Any]
    time: float
    token: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass
class Fault:
    """A queued failure answered instead of the next matching call (``status`` 0 with a
    ``delay``: the call only waits that long, then is answered as usual)."""

    status: int
    retry_after: int | None = None
    description: str | None = None
    remaining: int = 1
    delay: float = 0.0


class Displayed:
    """What each bot message showed over time: the text it was posted with, then the text
    of every edit, in order. Keyed by (chat, message id) so tests can ask per chat."""

    def __init__(self) -> None:
        self._texts: dict[tuple[str, str], list[str]] = {}

    def posted(self, chat: object, message_id: object, text: str) -> None:
        self._texts[(str(chat), str(message_id))] = [text]

    def edited(self, chat: object, message_id: object, text: str) -> None:
        self._texts.setdefault((str(chat), str(message_id)), []).append(text)

    def current(self, chat: object, message_id: object) -> str | None:
        texts = self._texts.get((str(chat), str(message_id)))
        return texts[-1] if texts else None

    def in_chat(self, chat: object) -> list[list[str]]:
        """Per bot message in ``chat`` (oldest first), the texts it showed, oldest first."""
        return [list(texts) for (c, _), texts in self._texts.items() if c == str(chat)]


def json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """JSON response whose Content-Type is exactly ``application/json``.

    aiohttp's ``json_response`` appends ``; charset=utf-8``; some clients (the
    Mattermost drivers) compare the header literally, so we never do.
    """
    hdrs = {"Content-Type": "application/json"}
    if headers:
        hdrs.update(headers)
    return web.Response(body=json.dumps(data).encode(), status=status, headers=hdrs)


def decode_form_values(form: Mapping[str, Any]) -> dict[str, Any]:
    """Turn form fields into params: strings stay strings, ``[``/``{`` values are JSON-decoded.

    Bot API clients send every value as a string and nested objects as JSON
    strings; file parts are recorded by their file name.
    """
    out: dict[str, Any] = {}
    for key, value in form.items():
        if isinstance(value, str):
            stripped = value.lstrip()
            if stripped[:1] in ("[", "{"):
                try:
                    out[key] = json.loads(value)
                    continue
                except ValueError:
                    pass
            out[key] = value
        else:  # aiohttp FileField
            out[key] = {"filename": getattr(value, "filename", None)}
    return out


async def read_params(request: web.Request) -> dict[str, Any]:
    """Params from query string plus a JSON, urlencoded or multipart body."""
    params: dict[str, Any] = decode_form_values(request.query)
    if not request.can_read_body:
        return params
    if request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        params.update(decode_form_values(await request.post()))
        return params
    raw = await request.read()
    if raw.strip():
        try:
            body = json.loads(raw)
        except ValueError:
            params["_raw"] = raw.decode(errors="replace")
        else:
            if isinstance(body, dict):
                params.update(body)
            else:
                params["_body"] = body
    return params


class FakeServer:
    """Base class: an aiohttp app on 127.0.0.1:<free port> with a call log and faults.

    Use as ``async with FakeX() as fake:`` or ``await fake.start()`` /
    ``await fake.close()``.  Must be started inside the event loop the test
    runs in (asyncio primitives are bound to it).
    """

    #: seconds aiohttp waits for in-flight handlers when closing
    shutdown_timeout: float = 2.0

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._runner: web.AppRunner | None = None
        self.calls: list[Call] = []
        #: the texts every bot message showed (fakes of platforms that edit messages)
        self.displayed = Displayed()
        self._faults: dict[str, deque[Fault]] = {}
        self._closing: asyncio.Event | None = None

    # lifecycle -------------------------------------------------------------
    def build_app(self) -> web.Application:
        """Return the aiohttp application (subclasses add their routes)."""
        raise NotImplementedError

    async def start(self) -> Self:
        """Bind the server and start serving; returns ``self``."""
        if self._runner is not None:
            return self
        self._closing = asyncio.Event()
        app = self.build_app()
        app.on_shutdown.append(self._on_shutdown)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=self.shutdown_timeout)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._requested_port)
        await site.start()
        self._runner = runner
        address = runner.addresses[0]
        self._port = int(address[1])
        return self

    async def close(self) -> None:
        """Wake long-running handlers, close sockets and stop the server."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if self._closing is not None:
            self._closing.set()
        await runner.cleanup()

    async def _on_shutdown(self, app: web.Application) -> None:
        """Hook for subclasses: end websockets / long polls before the runner waits."""
        if self._closing is not None:
            self._closing.set()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def closing(self) -> bool:
        """True once ``close()`` began; long polls use it to return early."""
        return self._closing is not None and self._closing.is_set()

    @property
    def port(self) -> int:
        """The bound TCP port (only after ``start()``)."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` without a trailing slash."""
        return f"http://{self.host}:{self.port}"

    # call log --------------------------------------------------------------
    def record(
        self,
        method: str,
        params: dict[str, Any],
        request: web.Request | None = None,
        token: str | None = None,
    ) -> Call:
        """Append a call to ``calls`` and return it."""
        call = Call(
            method=method,
            params=params,
            time=time.time(),
            token=token,
            headers=dict(request.headers) if request is not None else {},
        )
        self.calls.append(call)
        return call

    def calls_to(self, method: str) -> list[Call]:
        """Calls of one API method, oldest first."""
        return [c for c in self.calls if c.method == method]

    def method_names(self) -> list[str]:
        """The sequence of method names called so far (handy in assertions)."""
        return [c.method for c in self.calls]

    def reset_calls(self) -> None:
        """Forget recorded calls (state such as messages is kept)."""
        self.calls.clear()

    # faults ----------------------------------------------------------------
    def _queue_fault(self, method: str, fault: Fault) -> None:
        self._faults.setdefault(method, deque()).append(fault)

    def take_fault(self, method: str) -> Fault | None:
        """Pop the next fault for ``method`` (or for ``"*"``, any method), if any."""
        for key in (method, "*"):
            queue = self._faults.get(key)
            if queue:
                fault = queue[0]
                fault.remaining -= 1
                if fault.remaining <= 0:
                    queue.popleft()
                return fault
        return None

    def clear_faults(self) -> None:
        """Drop every queued fault."""
        self._faults.clear()

    # waiting ---------------------------------------------------------------
    @overload
    async def wait_for(
        self, predicate: Callable[[], Awaitable[T]], timeout: float = ..., message: str = ...
    ) -> T: ...

    @overload
    async def wait_for(
        self, predicate: Callable[[], T], timeout: float = ..., message: str = ...
    ) -> T: ...

    async def wait_for(
        self,
        predicate: Callable[[], Any],
        timeout: float = 5.0,
        message: str = "",
    ) -> Any:
        """Wait (with a deadline) until ``predicate()`` is truthy; see ``wait_until``."""
        return await wait_until(predicate, timeout=timeout, message=message)

    async def wait_for_count(self, found: Callable[[], list[T]], count: int, timeout: float,
                             message: str) -> list[T]:
        """Wait until ``found()`` holds at least ``count`` entries; return them."""

        def enough() -> list[T]:
            entries = found()
            return entries if len(entries) >= count else []

        return await wait_until(enough, timeout=timeout, message=message)

    async def wait_for_calls(self, method: str, count: int = 1, timeout: float = 5.0) -> list[Call]:
        """Wait until ``method`` was called at least ``count`` times; return those calls."""
        return await self.wait_for_count(
            lambda: self.calls_to(method), count, timeout,
            f"{count} call(s) to {method}; saw {self.method_names()}")
