"""A server loads redis-durable's scripts before it listens, so the first delivery of a fresh
process sends no ``NOSCRIPT`` round trip; concurrent callers that meet ``NOSCRIPT`` (a
restarted server) share one ``SCRIPT LOAD``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.pipeline.scripts import scripts_for
from gateway.stores import embedded
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.redis import connect
from gateway.stores.runtime import Runtime
from gateway.stores.scripts import bound_to
from gateway.stores.warm import warm
from tests.inbound.webhook_helpers import body_of, standard


async def test_the_scripts_are_loaded_before_the_first_request(
        runtime: Runtime, make_client: Callable[..., Any]) -> None:
    claim_add = scripts_for(runtime.durable).claim_add  # what a delivery runs first
    assert await runtime.durable.script_exists(claim_add.sha) == [False]
    client = await make_client()
    scripts = bound_to(runtime.durable)
    assert claim_add in scripts
    assert all(await runtime.durable.script_exists(*(s.sha for s in scripts)))
    body = body_of({"text": "first"})
    async with client.post("/v1/webhooks/demo", data=body,
                           headers=standard(body, "first")) as response:
        assert response.status == 202


async def test_a_store_that_does_not_answer_is_logged_not_fatal() -> None:
    dead = connect(f"redis://127.0.0.1:{embedded.free_port()}/0", variable="test")
    try:
        scripts_for(dead)
        assert await warm(dead, seconds=2.0) is False
    finally:
        await dead.aclose()


async def test_concurrent_noscripts_share_one_load(
        redis_factory: Callable[..., embedded.RedisServer]) -> None:
    server = redis_factory("durable")
    redis = connect(server.url, variable="test")
    try:
        auto = AutoPipeline(redis)
        script = redis.register_script("return redis.call('INCR', KEYS[1])")
        replies = await asyncio.gather(*(auto.run_script(script, ["q:{pipeline}:n"], [])
                                         for _ in range(20)))
        assert sorted(replies) == list(range(1, 21))
        stats = await redis.info("commandstats")
        assert stats["cmdstat_script|load"]["calls"] == 1
    finally:
        await redis.aclose()
