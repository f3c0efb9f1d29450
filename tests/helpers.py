"""Helpers shared by tests: condition waits with deadlines, registry scans."""

from __future__ import annotations

from typing import Any

from gateway import keys
from tests.fakes.waiting import wait_until

__all__ = ["registry_violations", "wait_until"]


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
