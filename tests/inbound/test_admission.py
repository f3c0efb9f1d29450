"""Admission by class on a small redis-durable (64 MB): jobs are refused first, signed
webhooks next, chat platform events never by class; the bystanders keep getting 2xx, and
the chats (real Telegram updates and signed Slack events, through their routes) are still
answered."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from gateway.access import apikeys
from gateway.access.principal import parse_scopes
from gateway.inbound import admission
from gateway.stores.runtime import open_runtime
from gateway.web.app import create_app
from tests.fakes import FakeSlack, FakeTelegram
from tests.helpers import wait_until
from tests.inbound.bystanders import CHAT_COMPONENTS, chats_go_on, with_chat
from tests.inbound.webhook_helpers import body_of, standard

pytestmark = pytest.mark.single_instance
COMPONENTS = ("gateway.web.health", "gateway.inbound.webhooks", "gateway.inbound.jobs",
              "gateway.push.web", "gateway.web.dashboard", *CHAT_COMPONENTS)


async def fill_to(redis: Any, ratio: float) -> None:
    """Filler values until ``used_memory / maxmemory`` reaches ``ratio``."""
    n = 0
    while True:
        info = await redis.info("memory")
        if int(info["used_memory"]) / int(info["maxmemory"]) >= ratio:
            return
        async with redis.pipeline(transaction=False) as pipe:
            for _ in range(64):
                pipe.set(f"filler:{n}", "f" * 16_384)
                n += 1
            await pipe.execute()


async def test_jobs_give_way_first_then_webhooks_and_chats_go_on(
        settings: Any, redis_factory: Callable[..., Any], make_client: Callable[..., Any],
        fake_telegram: FakeTelegram, fake_slack: FakeSlack) -> None:
    server = redis_factory("durable", maxmemory="64mb")
    rt = await open_runtime(dataclasses.replace(
        with_chat(settings, fake_telegram, fake_slack), durable_url=server.url))
    try:
        app = create_app(rt, COMPONENTS)
        client = await make_client(app, rt=rt)
        counter = iter(range(10_000))

        async def job() -> int:
            async with client.post("/v1/jobs", json={"document": {"text": "x"}}) as response:
                return response.status

        async def webhook() -> int:
            body = body_of({"text": "signed"})
            async with client.post("/v1/webhooks/demo", data=body,
                                   headers=standard(body, f"adm-{next(counter)}")) as response:
                return response.status

        assert (await job(), await webhook()) == (202, 202)

        async def refused(call: Callable[[], Any], ratio: float) -> bool:
            # Topped up each time: used_memory also moves on its own (buffers come and go).
            await fill_to(rt.durable, ratio)
            return await call() == 503

        await wait_until(lambda: refused(job, 0.75), timeout=10,
                         message="jobs refused past 70 %")
        assert await webhook() == 202  # the signed webhooks still get through
        await chats_go_on(client, app, fake_telegram, fake_slack)
        assert await job() == 503  # still refused while the chats went on

        async def reported() -> bool:
            await fill_to(rt.durable, 0.75)
            async with client.get("/readyz") as ready:
                detail = (await ready.json())["checks"]["admission"]["detail"]
            async with client.get("/v1/dashboard/summary") as summary:  # the page's banner
                closed = (await summary.json())["admission"]["closed"]
            return "closed for jobs" in detail and closed == ["jobs"]

        await wait_until(reported, timeout=10, message="/readyz and the dashboard say so")
        await wait_until(lambda: refused(webhook, 0.9), timeout=10,
                         message="webhooks refused past 85 %")
        await fill_to(rt.durable, 0.9)
        await chats_go_on(client, app, fake_telegram, fake_slack)  # chats go on
        assert (await job(), await webhook()) == (503, 503)
    finally:
        await rt.close()


async def test_a_flood_inside_one_refresh_overshoots_by_at_most_the_quotas(
        settings: Any, redis_factory: Callable[..., Any], make_client: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ratio is re-read at most every 0.5 s, so jobs that arrive between two reads are
    all admitted by class. Worst case here, the whole flood inside one (endless) window at
    68 %: what gets in is bounded by the per-credential byte quotas, and the rest is 429."""
    monkeypatch.setattr(admission, "REFRESH_SECONDS", 3600.0)
    quota, size, per_credential = 2 * 2**20, 192 * 2**10, 40
    server = redis_factory("durable", maxmemory="64mb")
    rt = await open_runtime(dataclasses.replace(settings, durable_url=server.url, sections={
        **settings.sections, "quotas": {"bytes_per_credential": quota}}))
    try:
        client = await make_client(create_app(rt, COMPONENTS), rt=rt)
        keys = [str((await apikeys.create(rt.pg, name, parse_scopes("jobs:write"), ()))["key"])
                for name in ("flood-a", "flood-b")]
        await fill_to(rt.durable, 0.68)
        before = int((await rt.durable.info("memory"))["used_memory"])

        async def job(key: str, n: int) -> int:
            async with client.post("/v1/jobs", json={"document": {"text": f"{n:06d}" + "x" * (
                    size - 6)}}, headers={"Authorization": f"Bearer {key}"}) as response:
                return response.status

        statuses = await asyncio.gather(*(job(key, n) for key in keys
                                          for n in range(per_credential)))
        memory = await rt.durable.info("memory")
        after = int(memory["used_memory"])
        assert after > 0.70 * int(memory["maxmemory"])  # past the jobs' threshold: the window
        for i in range(len(keys)):
            mine = statuses[i * per_credential:(i + 1) * per_credential]
            assert set(mine) == {202, 429}, mine  # never refused by class: the window
            assert 0 < mine.count(202) * size <= quota
        assert after - before < 2 * len(keys) * quota  # not the flood's 15 MiB
    finally:
        await rt.close()
