"""``GATEWAY_DURABLE_ACK=aof``: a 202 only after WAITAOF confirms the write on disk (one wait
per coalesced batch), refused with 503 where the server cannot confirm, and the doctor says
which servers can."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from gateway.config import Settings
from gateway.pipeline.stages import meta_key
from gateway.stores import doctor, embedded
from gateway.stores.coalesce import AutoPipeline, NotOnDisk
from gateway.stores.redis import connect
from gateway.stores.runtime import open_runtime
from gateway.web.app import create_app
from tests.inbound.webhook_helpers import body_of, post_as_sender, standard

pytestmark = pytest.mark.single_instance
COMPONENTS = ("gateway.web.health", "gateway.inbound.webhooks")


async def _post(client: Any, n: int) -> int:
    """As a sender: a 503 (a batch's WAITAOF waits up to a second for appendfsync everysec,
    so a delivery that missed a batch can outlast the write budget) is sent again."""
    body = body_of({"text": f"on disk {n}"})
    response = await post_as_sender(client, "/v1/webhooks/demo", body,
                                    standard(body, f"aof-{n}"))
    return int(response.status)


async def test_202s_under_aof_survive_a_kill9_of_redis_durable(
        settings: Settings, redis_factory: Callable[..., embedded.RedisServer],
        make_client: Callable[..., Any]) -> None:
    server = redis_factory("durable", binary=embedded.find_valkey_server())
    aof = dataclasses.replace(settings, durable_url=server.url, durable_ack="aof")
    rt = await open_runtime(aof)
    try:
        client = await make_client(create_app(rt, COMPONENTS), rt=rt)
        statuses = await asyncio.gather(*(_post(client, n) for n in range(50)))
        assert statuses == [202] * 50
        server.kill()  # kill -9 the moment the last 202 left
        server.start()
        check = connect(server.url, variable="test")
        try:
            present = await check.hmget(meta_key(), [f"webhook:demo:aof-{n}"
                                                     for n in range(50)])
        finally:
            await check.aclose()
        assert all(value is not None for value in present)
        checks = await doctor.check_durable(rt.durable, server.url, "aof")
        assert any(c.status == "warn" and "appendfsync everysec" in c.message for c in checks)
    finally:
        await rt.close()


async def test_a_server_without_waitaof_answers_503_and_fails_the_doctor(
        settings: Settings, redis_factory: Callable[..., embedded.RedisServer],
        make_client: Callable[..., Any]) -> None:
    server = redis_factory("durable")  # the machine's redis-server (7.0 here: no WAITAOF)
    client_ = connect(server.url, variable="test")
    try:
        version = (await client_.info("server"))["redis_version"]
    finally:
        await client_.aclose()
    if tuple(int(p) for p in version.split(".")[:2]) >= (7, 2):
        pytest.skip(f"redis-server {version} has WAITAOF")
    aof = dataclasses.replace(settings, durable_url=server.url, durable_ack="aof")
    checks = await doctor.run_checks(aof)
    assert any(c.status == "fail" and "WAITAOF" in c.message for c in checks)
    rt = await open_runtime(aof)
    try:
        client = await make_client(create_app(rt, COMPONENTS), rt=rt)
        body = body_of({"text": "not on disk"})
        async with client.post("/v1/webhooks/demo", data=body,
                               headers=standard(body, "no-waitaof")) as response:
            assert response.status == 503 and response.headers["Retry-After"]
    finally:
        await rt.close()


async def test_a_server_with_aof_off_cannot_confirm(
        redis_factory: Callable[..., embedded.RedisServer]) -> None:
    server = redis_factory("durable", binary=embedded.find_valkey_server(), appendonly="no")
    redis = connect(server.url, variable="test")
    try:
        auto = AutoPipeline(redis, wait_aof=True)
        with pytest.raises(NotOnDisk):
            await auto.execute("SET", "q:{pipeline}:probe", "1")
        checks = await doctor.check_durable(redis, server.url, "aof")
        assert any(c.status == "ok" and "WAITAOF" in c.message for c in checks)
        assert any(c.status == "fail" and "appendonly" in c.message for c in checks)
    finally:
        await redis.aclose()


async def test_one_wait_per_batch(redis_factory: Callable[..., embedded.RedisServer]) -> None:
    server = redis_factory("durable", binary=embedded.find_valkey_server())
    redis = connect(server.url, variable="test")
    try:
        auto = AutoPipeline(redis, wait_aof=True)
        await asyncio.gather(*(auto.execute("SET", f"q:{{pipeline}}:k{n}", n)
                               for n in range(100)))
        assert auto.flushes <= 3
        stats = await redis.info("commandstats")
        assert stats["cmdstat_waitaof"]["calls"] == auto.flushes
    finally:
        await redis.aclose()


async def test_a_script_the_server_forgot_is_rerun_under_the_batch_wait(
        redis_factory: Callable[..., embedded.RedisServer]) -> None:
    """A new (or restarted) server answers NOSCRIPT: the script is loaded and called by SHA
    again through the pipeline, so the flush's WAITAOF covers its write; never a direct
    EVAL on another connection, which no WAITAOF of the batch covers."""
    server = redis_factory("durable", binary=embedded.find_valkey_server())
    redis = connect(server.url, variable="test")
    try:
        auto = AutoPipeline(redis, wait_aof=True)
        script = redis.register_script("return redis.call('SET', KEYS[1], ARGV[1])")
        assert await auto.run_script(script, ["q:{pipeline}:forgotten"], ["1"]) == "OK"
        stats = await redis.info("commandstats")
        assert "cmdstat_eval" not in stats
        assert stats["cmdstat_evalsha"]["calls"] == 2  # NOSCRIPT, then the run
        assert stats["cmdstat_waitaof"]["calls"] == auto.flushes == 2
        assert await redis.get("q:{pipeline}:forgotten") == "1"
    finally:
        await redis.aclose()
