"""A rolling restart under load: two ``gateway serve`` replicas and a worker are each sent
SIGTERM and replaced, one at a time, while webhooks, jobs and an SSE client keep going. As a
balancer would, the test stops sending to a replica before it signals it. Every request is
answered 2xx or 503 + Retry-After (none is cut off), no item waits for its lease (nothing is
reclaimed), and the SSE client, moved from the stopping replica by its ``gateway.disconnect``,
sees every ``pipeline`` row once, in order."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.pipeline.stages import STAGES, stats_key
from gateway.push.client import PushClient
from gateway.stores.runtime import Runtime
from tests.conftest import TEST_ADMIN_TOKEN, ServerSet
from tests.fakes import FakeSlack, FakeTelegram
from tests.helpers import wait_until
from tests.inbound.webhook_helpers import body_of, standard
from tests.replicas.fleet import Fleet, fleet_env

ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}


class Balancer:
    """Sends to the replicas in rotation, never to one taken out."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = list(urls)
        self.out: set[str] = set()

    def pick(self) -> str:
        return random.choice([u for u in self.urls if u not in self.out])


@pytest.fixture
async def fleet(servers: ServerSet, fake_telegram: FakeTelegram, fake_slack: FakeSlack,
                tmp_path: Path) -> AsyncIterator[Fleet]:
    fleet = Fleet(fleet_env(servers, fake_telegram, fake_slack, tmp_path), tmp_path)
    try:
        yield fleet
    finally:
        await fleet.close()


async def steady_load(http: aiohttp.ClientSession, balancer: Balancer, stop: asyncio.Event,
                      answers: list[Any], accepted: set[str]) -> None:
    counter = itertools.count()
    while not stop.is_set():
        n = next(counter)
        url = balancer.pick()
        try:
            if n % 2:
                body = body_of({"text": f"rolling note {n}"})
                request = http.post(f"{url}/v1/webhooks/demo", data=body,
                                    headers=standard(body, f"roll-{n}"))
            else:
                request = http.post(f"{url}/v1/jobs", headers=ADMIN,
                                    json={"job_id": f"roll-job-{n}",
                                          "document": {"text": f"rolling job {n}"}})
            async with request as response:
                body_json = await response.json()
                answers.append((response.status, response.headers.get("Retry-After")))
                if response.status == 202:
                    accepted.add(body_json["item_id"])
        except (aiohttp.ClientError, TimeoutError) as exc:
            answers.append((type(exc).__name__, url))
        await asyncio.sleep(0.02)  # a steady rate, not a synchronisation


@pytest.mark.slow
async def test_rolling_restart_under_load_loses_and_cuts_off_nothing(
        runtime: Runtime, fleet: Fleet) -> None:
    await fleet.start(serves=2, workers=1)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        await fleet.wait_ready(http)
        balancer = Balancer([url for _, url in fleet.servers])
        stop, answers, accepted = asyncio.Event(), [], set[str]()
        rows: list[int] = []
        async with PushClient(balancer.urls, ["pipeline"], since={"pipeline": 0}, headers=ADMIN,
                              poll_seconds=1) as push:
            async def follow() -> None:
                async for row in push:
                    rows.append(row.offset)

            following = asyncio.create_task(follow())
            load = asyncio.create_task(steady_load(http, balancer, stop, answers, accepted))
            await wait_until(lambda: len(accepted) >= 10, timeout=20, message="load running")
            stop_times = []
            for index, (_, url) in enumerate(list(fleet.servers)):
                balancer.out.add(url)
                stop_times.append(await fleet.restart_server(index, f"serve{index}-new"))
                await fleet.wait_ready(http)
                balancer.out.discard(url)
                await _more_accepted(accepted, 10, "load answered by the new replica")
            stop_times.append(await fleet.restart_worker(0, "worker0-new"))
            await _more_accepted(accepted, 10, "load after the worker restart")
            stop.set()
            await load
            await wait_until(lambda: _all_done(runtime, len(accepted)), timeout=60,
                             message="every accepted item through all stages")
            total = len(accepted) * len(STAGES)
            await wait_until(lambda: len(rows) >= total, timeout=30,
                             message="the SSE client saw every pipeline row")
            following.cancel()
    failures = [a for a in answers if a[0] not in (200, 202) and not (
        a[0] == 503 and a[1])]
    assert failures == [], failures[:10]
    assert rows == list(range(1, total + 1))  # every row once, in order, across replicas
    assert push.connects >= 2  # it did move to another replica
    reclaimed = [int(await runtime.durable.hget(stats_key(s), "reclaimed") or 0)
                 for s in STAGES]
    assert reclaimed == [0] * len(STAGES)  # nothing waited for its lease
    assert max(stop_times) <= 12  # each process stopped within its 10 s budget (+ exit)


async def _more_accepted(accepted: set[str], more: int, message: str) -> None:
    wanted = len(accepted) + more
    await wait_until(lambda: len(accepted) >= wanted, timeout=20, message=message)


async def _all_done(runtime: Runtime, items: int) -> bool:
    done = await runtime.pg.fetchval(
        "SELECT count(*) FROM pipeline_journal WHERE stage = 'graph'")
    return bool(done >= items)
