"""Three ``gateway serve`` replicas and two ``gateway worker`` processes on one set of stores.
Webhooks, jobs, Telegram updates and Slack events go to random replicas, each
delivered three times (twice at once, once more later): every one is processed once. One
worker is killed -9 while it holds leases: RECLAIM, running in every replica and in both
workers, returns each of its items exactly once, and every item ends with exactly one
journal row and one ``pipeline`` feed row per stage."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.pipeline.stages import STAGES, dead_key, inflight_key, stats_key
from gateway.stores.runtime import Runtime
from tests.conftest import TEST_ADMIN_TOKEN, ServerSet
from tests.fakes import FakeSlack, FakeTelegram, event_callback, text_update
from tests.fakes.slack import signed_json
from tests.helpers import wait_until
from tests.inbound.webhook_helpers import body_of, standard
from tests.replicas.fleet import SLACK_SIGNING_SECRET, TELEGRAM_SECRET, Fleet, fleet_env

WEBHOOKS = 30
JOBS = 30
UPDATES = 10
EVENTS = 10
ITEMS = {f"webhook:demo:rep-{n}" for n in range(WEBHOOKS)} | {f"job-{n}" for n in range(JOBS)}

Send = Callable[[str], Awaitable[tuple[int, Any]]]
ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}


@pytest.fixture
async def fleet(runtime: Runtime, servers: ServerSet, fake_telegram: FakeTelegram,
                fake_slack: FakeSlack, tmp_path: Path) -> AsyncIterator[Fleet]:
    fleet = Fleet(fleet_env(servers, fake_telegram, fake_slack, tmp_path), tmp_path)
    try:
        yield fleet
    finally:
        await fleet.close()


async def thrice(send: Send, urls: Callable[[], str]) -> list[tuple[int, Any]]:
    """Twice at once to two random replicas, then once more: a sender's retries."""
    first = await asyncio.gather(send(urls()), send(urls()))
    return [*first, await send(urls())]


def webhook_sender(http: aiohttp.ClientSession, n: int) -> Send:
    body = body_of({"type": "note", "text": f"replica note {n} #r{n} @user{n}"})
    headers = standard(body, f"rep-{n}")

    async def send(url: str) -> tuple[int, Any]:
        async with http.post(f"{url}/v1/webhooks/demo", data=body, headers=headers) as r:
            return r.status, await r.json()
    return send


def job_sender(http: aiohttp.ClientSession, n: int) -> Send:
    job = {"job_id": f"job-{n}", "document": {"text": f"job {n} text #j{n}"}}

    async def send(url: str) -> tuple[int, Any]:
        async with http.post(f"{url}/v1/jobs", json=job, headers=ADMIN) as r:
            return r.status, await r.json()
    return send


def telegram_sender(http: aiohttp.ClientSession, n: int) -> Send:
    update = text_update(f"hello {n}", chat_id=9000 + n)  # one chat each: 1 msg/s per chat

    async def send(url: str) -> tuple[int, Any]:
        async with http.post(f"{url}/telegram/webhook", json=update,
                             headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}) as r:
            return r.status, await r.read()
    return send


def slack_sender(http: aiohttp.ClientSession, n: int) -> Send:
    payload = event_callback(event_type="app_mention", text=f"hi {n}", channel=f"CREP{n}")
    tries = iter(range(3))

    async def send(url: str) -> tuple[int, Any]:
        body, headers = signed_json(SLACK_SIGNING_SECRET, payload)
        retry = next(tries)
        if retry:
            headers = {**headers, "X-Slack-Retry-Num": str(retry),
                       "X-Slack-Retry-Reason": "http_timeout"}
        async with http.post(f"{url}/slack/events", data=body, headers=headers) as r:
            return r.status, await r.read()
    return send


async def leases_of(runtime: Runtime, pid: int) -> set[tuple[str, str]]:
    """(stage, item) of every lease a worker process holds (its name is host:pid:random)."""
    held = set()
    for stage in STAGES:
        for item, value in (await runtime.durable.hgetall(inflight_key(stage))).items():
            if f":{pid}:" in value:
                held.add((stage, item))
    return held


async def reclaimed_total(runtime: Runtime) -> int:
    return sum([int(await runtime.durable.hget(stats_key(s), "reclaimed") or 0)
                for s in STAGES])


@pytest.mark.slow
async def test_replicas_and_workers_process_everything_exactly_once(
        runtime: Runtime, fleet: Fleet, fake_telegram: FakeTelegram,
        fake_slack: FakeSlack) -> None:
    await fleet.start(serves=3, workers=2)
    async with aiohttp.ClientSession() as http:
        await fleet.wait_ready(http)
        senders = ([webhook_sender(http, n) for n in range(WEBHOOKS)]
                   + [job_sender(http, n) for n in range(JOBS)]
                   + [telegram_sender(http, n) for n in range(UPDATES)]
                   + [slack_sender(http, n) for n in range(EVENTS)])
        traffic = asyncio.gather(*(thrice(send, fleet.url) for send in senders))

        # Kill -9 one worker as soon as it holds leases in the (slow) chunk stage.
        victim = fleet.workers[0]
        await wait_until(lambda: _holds_chunk(runtime, victim.pid), timeout=30,
                         message="the victim worker holding chunk leases")
        victim.send_signal(signal.SIGKILL)
        await victim.wait()
        held = await leases_of(runtime, victim.pid)
        answers = await traffic
    assert held, "the victim held nothing when killed"
    await check_answers(answers)
    # Its leases expire, and five reclaimers (three replicas, two workers) race for them.
    await wait_until(lambda: _journal_complete(runtime, len(ITEMS)), timeout=40,
                     interval=0.1, message="every item through all four stages")
    fleet.check_alive(victim)

    journal = await runtime.pg.fetch(
        "SELECT item_id, stage, count(*) AS n FROM pipeline_journal GROUP BY 1, 2")
    assert {(r["item_id"], r["stage"]) for r in journal} == {
        (i, s) for i in ITEMS for s in STAGES}
    assert {r["n"] for r in journal} == {1}
    feed = await runtime.pg.fetch(
        "SELECT payload->>'item_id' AS item, kind, count(*) AS n FROM feed "
        "WHERE topic = 'pipeline' GROUP BY 1, 2")
    assert {(r["item"], r["kind"]) for r in feed} == {(i, s) for i in ITEMS for s in STAGES}
    assert {r["n"] for r in feed} == {1}
    offsets = await runtime.pg.fetch(
        "SELECT \"offset\" FROM feed WHERE topic = 'pipeline' ORDER BY 1")
    assert [r["offset"] for r in offsets] == list(range(1, len(ITEMS) * 4 + 1))

    # Each of the victim's leases was reclaimed once, by one of the five reclaimers.
    assert await reclaimed_total(runtime) == len(held)
    for stage in STAGES:
        assert await runtime.durable.llen(dead_key(stage)) == 0
        assert await runtime.durable.hlen(inflight_key(stage)) == 0

    # One bot reply per update and per event, whatever replica or retry carried it.
    for n in range(UPDATES):
        assert fake_telegram.sent_texts(9000 + n) == [f"echo: hello {n} (1 messages)"]
    for n in range(EVENTS):
        assert fake_slack.posted_texts(f"CREP{n}") == [f"echo: hi {n} (1 messages)"]
    assert len(fake_telegram.sent_messages()) == UPDATES
    assert len(fake_slack.posted_messages()) == EVENTS
    assert await runtime.pg.fetchval("SELECT count(*) FROM conversation_messages") == 2 * (
        UPDATES + EVENTS)


async def _holds_chunk(runtime: Runtime, pid: int) -> bool:
    return any(stage == "chunk" for stage, _ in await leases_of(runtime, pid))


async def _journal_complete(runtime: Runtime, items: int) -> bool:
    done = await runtime.pg.fetchval(
        "SELECT count(*) FROM pipeline_journal WHERE stage = 'graph'")
    return bool(done >= items)


async def check_answers(answers: list[list[tuple[int, Any]]]) -> None:
    """Per delivery: the ingest routes accept once and call the rest duplicates; the chat
    routes acknowledge every copy with 200 (so the platform stops retrying)."""
    for n, tries in enumerate(answers[:WEBHOOKS]):
        assert sorted(status for status, _ in tries) == [200, 200, 202], tries
        assert {body["status"] for _, body in tries} == {"accepted", "duplicate"}
        accepted = next(body for status, body in tries if status == 202)
        assert accepted["item_id"] == f"webhook:demo:rep-{n}"
    for n, tries in enumerate(answers[WEBHOOKS:WEBHOOKS + JOBS]):
        assert sorted(status for status, _ in tries) == [200, 200, 202], tries
        assert {body["item_id"] for _, body in tries} == {f"job-{n}"}
    for tries in answers[WEBHOOKS + JOBS:]:
        # A copy that arrives while another holds the claim in progress (Redis Cluster, where
        # claim and enqueue are two steps) is 503 + Retry-After, so the platform retries it
        # instead of dropping an event whose first attempt may still fail; at least one 200.
        seen = [(s, json.loads(b or b"null") if s != 200 else None) for s, b in tries]
        assert 200 in [s for s, _ in seen], seen
        assert all(s == 200 or (s == 503 and body["error"] == "backpressure")
                   for s, body in seen), seen
