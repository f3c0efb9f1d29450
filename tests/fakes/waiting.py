"""Deadline-bounded waiting for tests.

Tests synchronise with background work (webhook handlers, pollers, websocket
listeners) by polling a condition until a deadline instead of sleeping a fixed
time: fast when things work, a clear failure message when they do not.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

__all__ = ["wait_until"]


@overload
async def wait_until(
    predicate: Callable[[], Awaitable[T]],
    timeout: float = ...,
    interval: float = ...,
    message: str = ...,
) -> T: ...


@overload
async def wait_until(
    predicate: Callable[[], T],
    timeout: float = ...,
    interval: float = ...,
    message: str = ...,
) -> T: ...


async def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 5.0,
    interval: float = 0.01,
    message: str = "",
) -> Any:
    """Poll ``predicate`` until it returns a truthy value, then return that value.

    ``predicate`` may be a plain function or return an awaitable (e.g. an
    ``async def``).  Exceptions raised by the predicate propagate at once.
    Raises ``AssertionError`` (with ``message`` and the last value seen) when
    ``timeout`` seconds pass without success.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        remaining = deadline - loop.time()
        if remaining <= 0:
            detail = message or getattr(predicate, "__name__", repr(predicate))
            raise AssertionError(
                f"condition not met within {timeout:.2f}s: {detail} (last value: {result!r})"
            )
        await asyncio.sleep(min(interval, remaining))
