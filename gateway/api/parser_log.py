"""Requests aiohttp's HTTP parser refuses are logged as one INFO line, not an ERROR traceback.

A request line or header over 8190 bytes, a NUL or control character in a header, raw bytes
in the target: aiohttp answers each with a plain-text 400 before any route runs, and logs
"Error handling request" at ERROR with the parser's traceback. That is the sender's mistake,
and a client repeating it would fill the log with tracebacks; so the record is rewritten, on
the ``aiohttp.server`` logger itself (every handler sees the rewritten one), to INFO with the
exception's class name and no traceback. Other errors on that logger are left as they are.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

LOGGER = "aiohttp.server"


class QuietParserErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500:
            record.levelno, record.levelname = logging.INFO, "INFO"
            # The template keeps aiohttp's "%s" (the peer); a class name holds no "%".
            record.msg = f"{record.msg} refused with {exc.code}: {type(exc).__name__}"
            record.exc_info = record.exc_text = None
        return True


def install() -> None:
    """Add the filter once per process (each application asks; only the first adds it)."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(f, QuietParserErrors) for f in logger.filters):
        logger.addFilter(QuietParserErrors())
