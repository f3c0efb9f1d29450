"""Dedup claims and push-style pub/sub on the clusters, with keys on every primary."""

from __future__ import annotations

import asyncio

from redis.asyncio.cluster import RedisCluster

from gateway import keys
from gateway.dedup import claims
from gateway.stores.runtime import Runtime
from tests.cluster.conftest import keys_on_every_primary
from tests.helpers import wait_until


async def test_claim_release_and_done_on_every_primary(runtime: Runtime) -> None:
    client = runtime.durable
    assert isinstance(client, RedisCluster)
    await client.initialize()
    placed = keys_on_every_primary(client, lambda i: keys.dedup_webhook("demo", f"m{i}"))
    for key in placed.values():
        first, second = await asyncio.gather(claims.claim(client, key, 60),
                                             claims.claim(client, key, 60))
        assert first.claimed != second.claimed
        winner = first if first.claimed else second
        assert await claims.release(client, winner)  # release.lua runs on the key's node
        retry = await claims.claim(client, key, 60)
        assert retry.claimed
        await claims.mark_done(client, retry, 60)
        assert await claims.state(client, key) == claims.DONE


async def _receive(pubsub: object, getter: str, expected: int) -> list[str]:
    got: list[str] = []

    async def drained() -> bool:
        message = await getattr(pubsub, getter)(ignore_subscribe_messages=True, timeout=0.05)
        if message is not None:
            got.append(message["data"])
        return len(got) >= expected

    await wait_until(drained, timeout=10, interval=0, message=f"{expected} messages")
    return got


async def test_classic_publish_reaches_a_subscriber_on_another_node(runtime: Runtime) -> None:
    """PUBLISH is broadcast over the cluster bus: any node's subscriber hears it."""
    client = runtime.cache
    assert isinstance(client, RedisCluster)
    await client.initialize()
    channel = keys.push_channel("pipeline")
    primaries = client.get_primaries()
    pubsub = client.pubsub(node=primaries[0])
    try:
        await pubsub.subscribe(channel)
        await wait_until(lambda: _numsub(client, channel), timeout=10, message="subscription")
        for offset in (1, 2, 3):
            await client.publish(channel, f"signal-{offset}", target_nodes=primaries[-1])
        assert await _receive(pubsub, "get_message", 3) == ["signal-1", "signal-2", "signal-3"]
    finally:
        await pubsub.aclose()


async def _numsub(client: RedisCluster, channel: str) -> bool:
    counts = await client.pubsub_numsub(channel, target_nodes=RedisCluster.ALL_NODES)
    return sum(n for _, n in counts) >= 1


async def test_sharded_publish_reaches_the_shard_subscriber(runtime: Runtime) -> None:
    """SPUBLISH/SSUBSCRIBE (Redis 7): the message stays on the channel's shard."""
    client = runtime.cache
    assert isinstance(client, RedisCluster)
    await client.initialize()
    channels = [keys.push_channel(f"conversation:{i}") for i in range(6)]
    pubsub = client.pubsub()
    try:
        for channel in channels:
            await pubsub.ssubscribe(channel)
        for channel in channels:
            await wait_until(lambda c=channel: _shard_subscribed(client, c), timeout=10,
                             message=f"shard subscription to {channel}")
            await client.spublish(channel, channel)
        assert sorted(await _receive(pubsub, "get_sharded_message", 6)) == sorted(channels)
    finally:
        await pubsub.aclose()


async def _shard_subscribed(client: RedisCluster, channel: str) -> bool:
    counts = await client.execute_command("PUBSUB SHARDNUMSUB", channel,
                                          target_nodes=client.get_node_from_key(channel))
    return sum(n for _, n in counts) >= 1
