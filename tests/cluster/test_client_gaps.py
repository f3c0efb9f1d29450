"""gateway.stores.cluster: code written for one instance runs unchanged on a cluster client
that has not connected yet (pipelined scripts after SCRIPT FLUSH, pubsub first)."""

from __future__ import annotations

import asyncio

from gateway import keys
from gateway.stores import redis as redis_clients
from gateway.stores.cluster import GatewayCluster
from tests.conftest import ServerSet
from tests.helpers import wait_until

INCR_BOTH = "redis.call('INCR', KEYS[1]); return redis.call('INCR', KEYS[2])"


async def test_scripts_in_a_pipeline_are_loaded_first(servers: ServerSet) -> None:
    client = redis_clients.connect(servers.durable_url, variable="test")
    assert isinstance(client, GatewayCluster)
    try:
        await client.script_flush()
        pairs = [(keys.q("t", f"a{i}"), keys.q("t", f"b{i}")) for i in range(3)]
        other = [(f"dedup:job:{{x{i}}}:a", f"dedup:job:{{x{i}}}:b") for i in range(3)]
        for _ in range(2):  # the second round runs on a SCRIPT FLUSHed cluster again
            async with client.pipeline(transaction=False) as pipe:
                script = pipe.register_script(INCR_BOTH)  # as scripts_for(pipe) does
                for a, b in pairs + other:  # several slots, so several nodes
                    await script(keys=[a, b], client=pipe)
                pipe.set("dedup:job:plain", "x", ex=60)
                replies = await pipe.execute()
            assert replies[:-1] == [replies[0]] * 6 and replies[-1] is True
            await client.script_flush()
        assert replies[0] == 2
    finally:
        await client.aclose()


async def test_pubsub_on_a_client_that_never_ran_a_command(servers: ServerSet) -> None:
    for sharded in (False, True):
        client = redis_clients.connect(servers.cache_url, variable="test")
        channel = keys.push_channel(f"fresh-{sharded}")
        pubsub = client.pubsub()
        try:
            if sharded:
                await pubsub.ssubscribe(channel)
            else:
                await pubsub.subscribe(channel)
            getter = pubsub.get_sharded_message if sharded else pubsub.get_message
            publish = client.spublish if sharded else client.publish
            got: list[str] = []

            async def heard(getter=getter, publish=publish, channel=channel, got=got) -> bool:
                await publish(channel, "hello")
                message = await getter(ignore_subscribe_messages=True, timeout=0.1)
                if message is not None:
                    got.append(message["data"])
                return bool(got)

            await wait_until(heard, timeout=10, message=f"a message (sharded={sharded})")
            assert got[0] == "hello"
        finally:
            await pubsub.aclose()
            await client.aclose()


async def test_concurrent_first_commands_on_fresh_clients(servers: ServerSet) -> None:
    """Without initialising first, about one fresh client in five failed here."""
    for attempt in range(15):
        client = redis_clients.connect(servers.durable_url, variable="test")
        key = keys.dedup_job(f"fresh-{attempt}")
        try:
            won = await asyncio.gather(*(client.set(key, "x", nx=True, ex=60)
                                         for _ in range(50)))
            assert sum(bool(w) for w in won) == 1
        finally:
            await client.aclose()
