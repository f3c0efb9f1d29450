"""How a failed send steers the retry loop: wait (``RetryLater`` or a platform 429), give up
at once (``Undeliverable``), or step out uncounted (``StoreOutage``)."""

from __future__ import annotations

import datetime as dt
from typing import Any


class RetryLater(Exception):
    """Raise from a send function when the platform asked us to wait (a 429)."""

    def __init__(self, seconds: float, detail: str = "rate limited") -> None:
        super().__init__(f"{detail}; retry after {seconds} s")
        self.seconds = float(seconds)


class Undeliverable(Exception):
    """Raise from a send function when retrying cannot help (bot blocked, chat gone, message
    refused): the reply goes straight to the dead letters."""


class StoreOutage(Exception):
    """A store the send's own checks read (the ``rl:`` buckets, the inbox fence) cannot be
    reached: no fault of the reply, so ``deliver`` neither retries nor dead-letters it. The
    caller gives the message back uncounted; the reply stays stored, unsettled, and the
    retry sends it."""


def retry_after_of(exc: BaseException) -> float | None:
    """Seconds to wait when ``exc`` is a platform rate limit, else None.

    Understands ``RetryLater``, python-telegram-bot's ``RetryAfter`` (``retry_after`` is an
    int or a timedelta depending on its settings) and slack_sdk's ``SlackApiError`` on HTTP
    429 (``Retry-After`` header).
    """
    if isinstance(exc, RetryLater):
        return exc.seconds
    value: Any = getattr(exc, "retry_after", None)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, int | float):
        return float(value)
    response = getattr(exc, "response", None)
    if response is not None and getattr(response, "status_code", None) == 429:
        headers = getattr(response, "headers", {}) or {}
        raw = next((v for k, v in headers.items() if k.lower() == "retry-after"), "1")
        if isinstance(raw, list):
            raw = raw[0] if raw else "1"
        try:
            return float(raw)
        except (TypeError, ValueError):
            return 1.0
    return None
