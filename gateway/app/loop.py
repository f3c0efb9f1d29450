"""The event loop of ``gateway serve`` and ``gateway worker``: uvloop where it is installed
(a dependency everywhere but Windows), asyncio's own with ``GATEWAY_LOOP=asyncio``.

Why uvloop by default: on the ingest bench the same ``gateway serve`` answered 1.17-2.04x the
signed webhooks per second and spent 1.14-1.37x less CPU per request on uvloop than on
asyncio's loop, side by side in one run (docs/performance.md, "Ingest")."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
CHOICES = ("uvloop", "asyncio")


def chosen(environ: dict[str, str] | os._Environ[str] | None = None) -> str:
    """``uvloop`` or ``asyncio``: ``GATEWAY_LOOP`` if set, else uvloop when importable."""
    value = (os.environ if environ is None else environ).get("GATEWAY_LOOP", "").strip()
    if value and value not in CHOICES:
        raise SystemExit(f"GATEWAY_LOOP must be one of {', '.join(CHOICES)} (got {value!r})")
    if value == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if value == "uvloop":
            raise SystemExit("GATEWAY_LOOP=uvloop but uvloop is not installed") from None
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    if chosen() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
