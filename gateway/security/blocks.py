"""The barrier's blocks as an operator sees them: which addresses are blocked, for how long
more, and lifting them (``gateway barrier list|clear``, ``GET|DELETE /v1/admin/barrier``).

A block is the key ``brute:{<address>}:block`` (``gateway.security.brute``); lifting one
deletes it and the address's failure count, so the address starts afresh. Serving processes
trust their memory of a block for at most ``brute_cache_seconds`` (1 s), so a lifted block
ends everywhere within that. Only address blocks are listed: the chat link-code barrier
(``brute:{link:...}``) has its own keys and is left alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from gateway.config import ConfigError, Settings
from gateway.security.brute import block_key, fail_key, group
from gateway.stores import redis as redis_clients
from gateway.stores.redis import AnyRedis

_PATTERN = "brute:{*}:block"
MAX_LISTED = 10_000  # a bounded answer, whatever a flood of addresses left behind


def _address(key: str) -> str | None:
    inner = key.removeprefix("brute:{").removesuffix("}:block")
    return None if inner.startswith("link:") or inner == key else inner


async def list_blocks(durable: AnyRedis, limit: int = MAX_LISTED) -> list[dict[str, Any]]:
    """Every blocked address with its remaining seconds, longest first (at most ``limit``)."""
    addresses: list[str] = []
    async for key in durable.scan_iter(match=_PATTERN, count=500):
        address = _address(str(key))
        if address is not None:
            addresses.append(address)
        if len(addresses) >= limit:
            break
    blocks = []
    for address in addresses:  # one TTL each: keys of many addresses span cluster slots
        remaining = int(await durable.ttl(block_key(address)))
        if remaining > 0:
            blocks.append({"address": address, "expires_in": remaining})
    return sorted(blocks, key=lambda b: (-b["expires_in"], b["address"]))


def normalise(address: str) -> str:
    """The address as the barrier counts it (an IPv6 address by its /64), so an operator
    may type the client's own address."""
    return group(address.strip())


async def clear(durable: AnyRedis, address: str | None) -> list[str]:
    """Lift one address's block (``None``: every block); the addresses that were blocked."""
    if address is None:
        targets = [b["address"] for b in await list_blocks(durable)]
    else:
        targets = [normalise(address)]
    lifted = []
    for target in targets:
        removed = int(await durable.delete(block_key(target)))
        await durable.delete(fail_key(target))
        if removed:
            lifted.append(target)
    return lifted


async def _run(args: argparse.Namespace, settings: Settings) -> list[Any]:
    if not settings.durable_url:
        raise ConfigError("GATEWAY_DURABLE_URL", "is required")
    durable = redis_clients.connect(settings.durable_url, variable="GATEWAY_DURABLE_URL")
    try:
        if args.barrier_action == "list":
            return await list_blocks(durable)
        return await clear(durable, None if args.all else args.address)
    finally:
        await durable.aclose()


def main(args: argparse.Namespace, settings: Settings) -> int:
    """``gateway barrier list``: one JSON line per blocked address; ``gateway barrier clear
    ADDRESS|--all``: one line naming what was lifted."""
    if args.barrier_action == "clear" and bool(args.all) == bool(args.address):
        raise SystemExit("gateway barrier clear: give an ADDRESS or --all (not both)")
    result = asyncio.run(_run(args, settings))
    if args.barrier_action == "list":
        for block in result:
            print(json.dumps(block))
    else:
        print(json.dumps({"cleared": result}))
    return 0
