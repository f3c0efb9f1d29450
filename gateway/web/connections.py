"""Connection admission: caps on open connections, in all and per client address, and what a
connection past them may still do, so that a flood of connections (idle SSE streams, slow
clients) cannot take the descriptors that platform deliveries and the balancer's probes need.

* Past ``per_ip`` open connections from one address (IPv6 grouped by /64; a trusted proxy
  is never capped, its clients are told apart by the routes' own limits), a new connection
  is answered ``429`` + ``Retry-After`` and closed before a byte of it is read.
* Past ``max`` a connection is still accepted, but it may only reach the routes that need no
  credential (``/healthz``, ``/readyz``, the signed inbound routes, the dashboard page): any
  other answers ``503`` + ``Retry-After`` and closes (``gateway.api.routes``).
* Past ``max + reserve`` the oldest *idle* connection (no request in progress: a kept-alive
  connection between requests, or one that never sent a whole request head) is closed to
  make room, so a flood of idle connections can never lock out a fresh one (a liveness
  probe, a platform's delivery): the flood only churns through its own. Only when none of
  the oldest ``SHED_SCAN`` is idle (every one is serving a request or an SSE stream) is the
  new connection answered ``503`` at once and closed.

Idle connections, and connections that send no complete request head, are closed by
aiohttp's keep-alive timer (``idle_seconds``), which also runs from the moment a connection
opens: a slow-header client holds its descriptor at most that long. Slow bodies are cut by
``body_seconds`` where the body is read (``gateway.inbound.http_intake``).

What aiohttp's HTTP parser refuses before any route runs (a request line or header over
8,190 bytes, a control character in a header, raw bytes in the target) is answered here with
the same status as every other error, ``{"error", "detail"}`` JSON, where aiohttp would answer
plain text quoting the refused line, which can hold a query's ``access_token``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from gateway.api.connection_settings import ConnectionSettings
from gateway.api.errors import json_error
from gateway.api.state import OVER_CAP
from gateway.config import Settings
from gateway.security.brute import BruteSettings, group, is_trusted
from gateway.web import dispatch


def _refusal(status: int, reason: str, code: str, detail: str) -> bytes:
    body = json.dumps({"error": code, "detail": detail}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Retry-After: 5\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


_PER_IP = _refusal(429, "Too Many Requests", "rate_limited",
                   "too many open connections from this address")
_FULL = _refusal(503, "Service Unavailable", "busy", "this server holds too many connections")


# How many of the oldest connections a full gate looks through for an idle one to close: a
# bounded scan per new connection, past the long-lived streams that are usually the oldest.
SHED_SCAN = 512


class ConnectionGate:
    """Counts open connections (one process) and decides each new one's fate."""

    def __init__(self, config: ConnectionSettings, brute: BruteSettings,
                 over_cap: set[asyncio.BaseTransport]) -> None:
        self.config = config
        self.most, self.hard = config.caps()
        self.trusted = brute.trusted_proxies
        self.over_cap = over_cap
        self.open = 0
        self.per_ip: dict[str, int] = {}
        self.shed = 0  # idle connections closed to make room, for tests and operators
        # Every admitted connection, oldest first (a dict keeps insertion order).
        self._connections: dict[_Admitted, None] = {}

    def admit(self, connection: _Admitted,
              transport: asyncio.BaseTransport) -> tuple[str, bytes | None]:
        """(the address counted, "" for none; the refusal to send, or None)."""
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) and peer else ""
        if self.open >= self.hard and not self._shed_one():
            return "", _FULL
        address = "" if not host or is_trusted(host, self.trusted) else group(host)
        if address and self.per_ip.get(address, 0) >= self.config.per_ip:
            return "", _PER_IP
        self.open += 1
        self._connections[connection] = None
        if address:
            self.per_ip[address] = self.per_ip.get(address, 0) + 1
        if self.open > self.most:
            self.over_cap.add(transport)
        return address, None

    def _shed_one(self) -> bool:
        """Close the oldest idle connection among the first ``SHED_SCAN``; False when none
        is idle. Its count is given back at once (the socket closes on the next loop turn),
        so a burst of new connections sheds one old one each."""
        for index, connection in enumerate(self._connections):
            if index >= SHED_SCAN:
                return False
            if connection.idle():
                connection.shed()
                self.shed += 1
                return True
        return False

    def release(self, connection: _Admitted, transport: asyncio.BaseTransport,
                address: str) -> None:
        self._connections.pop(connection, None)
        self.open -= 1
        self.over_cap.discard(transport)
        if address:
            left = self.per_ip[address] - 1
            if left:
                self.per_ip[address] = left
            else:
                del self.per_ip[address]


class _Admitted(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind the gate."""

    def __init__(self, gate: ConnectionGate, inner: asyncio.Protocol) -> None:
        self.gate = gate
        self.inner = inner
        self.transport: asyncio.BaseTransport | None = None  # None: refused at the gate
        self.address = ""

    def idle(self) -> bool:
        """No request in progress and none waiting (aiohttp's ``RequestHandler`` state):
        closing it loses nobody's answer."""
        inner = self.inner
        return (self.transport is not None
                and not getattr(inner, "_request_in_progress", True)
                and not getattr(inner, "_messages", True))

    def shed(self) -> None:
        """Close to make room for a newer connection: counted out now, closed at once."""
        transport = self.transport
        if transport is None:
            return
        self.connection_lost(None)  # gives the slot back and tells aiohttp
        abort = getattr(transport, "abort", None)  # uvloop's are no asyncio.Transport
        if abort is not None:
            abort()  # nothing to flush: it was idle
        else:
            transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.address, refusal = self.gate.admit(self, transport)
        if refusal is not None:
            transport.write(refusal)  # type: ignore[attr-defined]  # any stream transport
            transport.close()
            return
        self.transport = transport
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.transport is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.transport is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return
        self.gate.release(self, self.transport, self.address)
        self.transport = None
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class GatedSite(web.TCPSite):
    """A TCP site whose connections pass the gate before aiohttp's protocol sees them."""

    def __init__(self, runner: web.BaseRunner, gate: ConnectionGate, host: str, port: int,
                 **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self.gate = gate

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        if isinstance(self._runner, web.AppRunner):
            dispatch.install(server, self._runner.app)
        factory: Callable[[], asyncio.Protocol] = server
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Admitted(self.gate, _json_errors(factory())), self._host, self._port,
            backlog=self._backlog, reuse_address=self._reuse_address,
            reuse_port=self._reuse_port)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


PARSER_REFUSAL = ("the request could not be read as HTTP (a request line or header over "
                  "8190 bytes, a control character in a header, or raw bytes in the target)")


class _JsonErrors(RequestHandler):
    """aiohttp's request handler, answering its own errors (a request its parser refused) as
    JSON that quotes nothing of the request."""

    __slots__ = ()

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        refused = super().handle_error(request, status, exc, message)  # logs (parser_log)
        detail = PARSER_REFUSAL if refused.status < 500 else "unexpected error; see server log"
        answer = json_error(refused.status, None, detail)
        answer.force_close()
        return answer


def _json_errors(handler: asyncio.Protocol) -> asyncio.Protocol:
    """The handler aiohttp's server made, as a ``_JsonErrors`` (same slots, one method more):
    made by the server, so its arguments stay the server's."""
    handler.__class__ = _JsonErrors
    return handler


def runner_options(settings: Settings) -> dict[str, Any]:
    """``AppRunner`` arguments that bound a connection's idle time."""
    return {"keepalive_timeout": ConnectionSettings.from_settings(settings).idle_seconds}


def gated_site(runner: web.AppRunner, app: web.Application, settings: Settings,
               **kwargs: Any) -> GatedSite:
    """The site ``serve`` listens on, with the caps of ``[connections]``."""
    gate = ConnectionGate(ConnectionSettings.from_settings(settings),
                          BruteSettings.from_section(settings.section("security")),
                          app[OVER_CAP])
    return GatedSite(runner, gate, settings.host, settings.port, **kwargs)
