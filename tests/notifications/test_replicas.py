"""Every ``gateway serve`` delivers, a subscription is held by one process at a time, and
``kill -9`` of every process mid-delivery loses no row and repeats at most the row in
flight: real serve processes, a receiver that answers slowly (so rows are in flight at the
kill), 8 subscriptions of one topic, 40 events."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.stores.runtime import Runtime
from tests.conftest import TEST_ADMIN_TOKEN, ServerSet
from tests.fakes import FakeSlack, FakeTelegram
from tests.fakes.receiver import Receiver
from tests.fakes.slack import CHANNEL_ID
from tests.helpers import wait_until
from tests.notifications.test_chats import lines_of
from tests.replicas.fleet import Fleet, fleet_env

CONFIG = """
[notifications]
allow_http = true
allow_private_networks = true
poll_seconds = 0.5
lease_seconds = 2
retry_seconds = [0.2]
"""
ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}
SUBSCRIPTIONS = 8
EVENTS = 40


@pytest.fixture
async def fleet(servers: ServerSet, runtime: Runtime, fake_telegram: FakeTelegram,
                fake_slack: FakeSlack, tmp_path: Path) -> AsyncIterator[Fleet]:
    fleet = Fleet(fleet_env(servers, fake_telegram, fake_slack, tmp_path, CONFIG), tmp_path)
    try:
        yield fleet
    finally:
        await fleet.close()


async def held(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(f"{url}/metrics", headers=ADMIN) as response:
        text = await response.text()
    found = re.search(r"^gateway_notifications_held_subscriptions (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else 0


def in_order_with_one_repeat_at_most(ids: list[str]) -> bool:
    offsets = [int(i.rsplit(":", 1)[1]) for i in ids]
    repeats = sum(1 for a, b in itertools.pairwise(offsets) if a == b)
    return repeats <= 1 and all(a <= b for a, b in itertools.pairwise(offsets))


@pytest.mark.slow
async def test_kill_9_of_every_process_mid_delivery_loses_no_row(
        fleet: Fleet, receiver: Receiver) -> None:
    receiver.slow = 0.05
    await fleet.start(serves=2, workers=0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        await fleet.wait_ready(http)
        url = fleet.servers[0][1]
        for n in range(SUBSCRIPTIONS):
            async with http.post(f"{url}/v1/subscriptions", headers=ADMIN, json={
                    "topic": "k", "after": 0, "destination": {
                        "type": "webhook", "url": receiver.endpoint(f"s{n}")}}) as r:
                assert r.status == 201
        # Both replicas take a share of the subscriptions' partitions.
        await wait_until(lambda: all_hold(http, fleet), timeout=20,
                         message="every replica delivering")
        for n in range(EVENTS):
            async with http.post(f"{fleet.url()}/v1/topics/k/events", headers=ADMIN,
                                 json={"text": f"e{n}"}) as r:
                assert r.status == 202
        await wait_until(lambda: len(receiver.deliveries) >= SUBSCRIPTIONS * EVENTS // 3,
                         timeout=30, message="a third delivered")
        killed = await fleet.kill_all()
        assert all(p.returncode == -9 for p in killed)
        before = len(receiver.deliveries)
        assert before < SUBSCRIPTIONS * EVENTS, "everything was delivered before the kill"
        await fleet.start(serves=2, workers=0)

        def done() -> bool:
            return all(len(set(receiver.ids(f"s{n}"))) == EVENTS
                       for n in range(SUBSCRIPTIONS))

        await wait_until(done, timeout=60, message="every row delivered after the restart")
    for n in range(SUBSCRIPTIONS):
        ids = receiver.ids(f"s{n}")
        assert sorted(set(ids), key=lambda i: int(i.split(":")[1])) == [
            f"k:{e}" for e in range(1, EVENTS + 1)]
        assert in_order_with_one_repeat_at_most(ids), ids


@pytest.mark.slow
async def test_kill_9_mid_chat_post_shows_every_line_once(fleet: Fleet,
                                                          fake_slack: FakeSlack) -> None:
    """The first post reaches Slack but its answer comes 5 s late: every process is killed
    meanwhile. The next holder finds that post by its mark and goes on; the channel shows each
    row's line once, in order (later rows as digests: Slack takes 1 message/s per channel)."""
    await fleet.start(serves=2, workers=0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        await fleet.wait_ready(http)
        async with http.post(f"{fleet.url()}/v1/subscriptions", headers=ADMIN, json={
                "topic": "c", "after": 0, "template": "{text}",
                "destination": {"type": "slack", "channel": CHANNEL_ID}}) as r:
            assert r.status == 201, await r.text()
        fake_slack.answer_late("chat.postMessage", 5.0)
        expected = [f"r{n}" for n in range(20)]
        for text in expected:
            async with http.post(f"{fleet.url()}/v1/topics/c/events", headers=ADMIN,
                                 json={"text": text}) as r:
                assert r.status == 202
        await fake_slack.wait_for_posts(1, CHANNEL_ID, timeout=30)
        killed = await fleet.kill_all()  # the first post's answer is still 5 s away
        assert all(p.returncode == -9 for p in killed)
        assert len(fake_slack.posted_texts(CHANNEL_ID)) == 1
        await fleet.start(serves=2, workers=0)
        await wait_until(
            lambda: set(expected) <= set(lines_of(fake_slack.posted_texts(CHANNEL_ID))),
            timeout=60, message="every row's line in the channel after the restart")
    assert lines_of(fake_slack.posted_texts(CHANNEL_ID)) == expected


async def all_hold(http: aiohttp.ClientSession, fleet: Fleet) -> bool:
    counts = await asyncio.gather(*(held(http, url) for _, url in fleet.servers))
    return all(counts) and sum(counts) == SUBSCRIPTIONS
