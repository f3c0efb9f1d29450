"""What one delivery attempt came to, whatever the destination."""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass
from typing import Literal

Kind = Literal["ok", "wait", "gone", "failed"]


@dataclass(frozen=True)
class Outcome:
    """``ok``: the destination took it (a 2xx); ``wait``: asked to wait ``wait`` seconds
    (a 429 with ``Retry-After``), not a failure; ``gone``: it wants no more (``410``): pause;
    ``failed``: anything else, retried on the schedule."""

    kind: Kind
    detail: str = ""
    wait: float = 0.0


OK = Outcome("ok")


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(int(value[:10]))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def of_status(status: int, headers_retry_after: str | None, body: bytes) -> Outcome:
    """The outcome of an HTTP answer."""
    if 200 <= status < 300:
        return OK
    snippet = body[:200].decode("utf-8", "replace").replace("\n", " ")
    detail = f"HTTP {status}" + (f": {snippet}" if snippet.strip() else "")
    if status == 410:
        return Outcome("gone", detail)
    wait = retry_after(headers_retry_after)
    if status == 429 and wait is not None:
        return Outcome("wait", detail, wait)
    return Outcome("failed", detail, wait or 0.0)
