"""Helpers shared by tests: condition waits with deadlines, registry scans."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway import keys


async def wait_until(predicate: Callable[[], Any | Awaitable[Any]], timeout: float = 10.0,
                     interval: float = 0.02, message: str = "condition") -> Any:
    """Poll ``predicate`` (sync or async) until truthy; fail with ``message`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {message}")
        await asyncio.sleep(interval)


async def registry_violations(client: Any, instance: str) -> list[str]:
    """Every key of one instance that breaks the registry: unknown namespace, wrong instance,
    or a key that must expire but has no TTL."""
    problems = []
    async for key in client.scan_iter(count=1000):
        row = keys.row_for(key)
        if row is None or row.kind != "key":
            problems.append(f"{key}: no registry row")
        elif row.instance != instance:
            problems.append(f"{key}: belongs in {row.instance}, found in {instance}")
        elif row.must_expire and await client.ttl(key) < 0:
            problems.append(f"{key}: has no TTL")
    return problems
