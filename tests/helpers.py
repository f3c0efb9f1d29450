"""Helpers shared by tests: condition waits with deadlines, registry scans."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from gateway import keys
from gateway.notifications import engine as notification_engine
from tests.fakes.waiting import wait_until

__all__ = ["gateway_cli", "registry_violations", "request_keys", "wait_until"]


async def request_keys(client: Any) -> list[str]:
    """An instance's keys but the processes' own: a serving app marks itself a notification
    member (``lock:{notify}:members``) when it starts, before any request, so "a refused
    request writes nothing" compares this with []."""
    return sorted([k async for k in client.scan_iter(count=1000)
                   if k != notification_engine.MEMBERS_KEY])


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


async def gateway_cli(servers: Any, *args: str, config: str | None = None,
                      timeout: float = 60) -> tuple[int, str, str]:
    """Run ``gateway <args>`` against the test servers as an operator would:
    ``(exit code, stdout, stderr)``."""
    env = {**os.environ, "GATEWAY_DURABLE_URL": servers.durable_url,
           "GATEWAY_CACHE_URL": servers.cache_url, "GATEWAY_DATABASE_URL": servers.database_url}
    env.pop("GATEWAY_CONFIG", None)
    if config:
        env["GATEWAY_CONFIG"] = config
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", *args, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
