"""``gateway maintenance on [--reason TEXT] [--for SECONDS] | off | status``: one JSON line
``{"on", "reason", "expires_in"}`` with the state after the action."""

from __future__ import annotations

import argparse
import asyncio

from gateway.config import ConfigError, Settings
from gateway.leases import maintenance
from gateway.stores import redis as redis_clients


async def _run(args: argparse.Namespace, settings: Settings) -> maintenance.State:
    if not settings.durable_url:
        raise ConfigError("GATEWAY_DURABLE_URL", "is required")
    durable = redis_clients.connect(settings.durable_url, variable="GATEWAY_DURABLE_URL")
    try:
        if args.action == "on":
            return await maintenance.switch_on(durable, args.reason, args.seconds)
        if args.action == "off":
            return await maintenance.switch_off(durable)
        return await maintenance.read(durable)
    finally:
        await durable.aclose()


def main(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "on" and args.seconds <= 0:
        raise SystemExit("gateway maintenance: --for must be positive")
    print(maintenance.status_line(asyncio.run(_run(args, settings))))
    return 0
