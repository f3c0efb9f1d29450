"""``PreparedJson``: a small JSON answer whose status line and fixed headers are encoded once,
for the answers of the ingest path (``202 {"status": "accepted", ...}``).

aiohttp builds every response's headers at ``prepare``: a ``CIMultiDict`` filled in Python
(length, type, date, server, connection), a status line formatted, a signal hook awaited,
then the serialisation, through five coroutine layers, on every answer. Here the head is
the bytes aiohttp would write (``Content-Type``, ``Content-Length``, ``Date``, ``Server``, in
its order), handed to the request's writer as aiohttp's own ``write_headers`` does, so the
body still leaves with it in one write and the writer's flow control (``drain``) is
aiohttp's.

Only the plain case takes this way: HTTP/1.1, keep-alive, no ``on_response_prepare`` handler
on the app (CORS adds one when origins are configured), no cookies, no compression, a writer
without hooks. Anything else, or an aiohttp whose writer does not buffer its headers, is
prepared by aiohttp as usual. ``tests/api/test_prepared.py`` holds both ways to the same bytes.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion11
from aiohttp.http_writer import StreamWriter

# aiohttp >= 3.12 buffers a response's head in its writer (``_headers_buf``) and sends it
# with the body; an older one writes it at once, and there this class changes nothing.
_BUFFERED_HEAD = hasattr(StreamWriter, "_send_headers_with_payload")
_TAIL = f"\r\nServer: {SERVER_SOFTWARE}\r\n\r\n".encode()


class PreparedJson(web.Response):
    """``web.Response(status=status, body=body, content_type="application/json")``, prepared
    from bytes encoded when the answer is made rather than from a header map."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(status=status, body=body, content_type="application/json")
        self._head = (f"HTTP/1.1 {status} {self.reason}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\nDate: ").encode()

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        writer: Any = request._payload_writer
        if (not _BUFFERED_HEAD or self._payload_writer is not None or self._eof_sent
                or request.version != HttpVersion11 or not request.keep_alive
                or self._cookies or self._compression or type(writer) is not StreamWriter
                or writer._on_headers_sent is not None or writer._on_chunk_sent is not None
                or writer.chunked or _prepare_handlers(request)):
            return await super().prepare(request)
        self._req = request
        self._keep_alive = True
        self._must_be_empty_body = False
        self._payload_writer = writer
        # What StreamWriter.write_headers leaves behind; write_eof sends it with the body.
        writer.length = len(self._body)  # type: ignore[arg-type]
        writer._headers_buf = self._head + rfc822_formatted_time().encode() + _TAIL
        writer._headers_written = False
        return writer


def _prepare_handlers(request: web.BaseRequest) -> bool:
    """Whether an app the request went through has ``on_response_prepare`` handlers, which
    may change the headers (aiohttp's ``_prepare_hook`` sends the signal to each)."""
    match_info = getattr(request, "_match_info", None)
    if match_info is None:
        return False
    return any(app.on_response_prepare for app in match_info.apps)
