"""Acknowledged means durable: every ``gateway serve`` and ``gateway worker`` process is
killed -9 in the middle of 500 Telegram updates and 200 Slack events (or PostgreSQL is
stopped for 10 s), and afterwards every message is stored once and answered, in order per
chat.

Telegram cannot be asked whether a reply arrived, so a Telegram reply that reached the
platform just before its process died, and was not yet recorded, is sent again by the next
holder: the only duplicate the design allows, at most one per chat being answered at the
kill. (Slack replies carry metadata naming the message answered; a retried one checks the
channel first.) The test counts them and fails on any other kind (a lost message, one stored
twice, replies out of order, any Slack duplicate, more than one per Telegram chat).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.stores import embedded
from gateway.stores.migrate import migrate_url
from gateway.stores.runtime import Runtime
from tests.conftest import ServerSet
from tests.fakes import FakeSlack, FakeTelegram, event_callback, text_update
from tests.fakes.slack import signed_json
from tests.helpers import wait_until
from tests.replicas.fleet import SLACK_SIGNING_SECRET, TELEGRAM_SECRET, Fleet, fleet_env

FAST = """
[inbox]
lease_seconds = 2
poll_seconds = 0.05
outage_delay = 0.2
failure_delay = 0.2

[outbound]
backoff = 0.01

[ratelimit.platforms.telegram.bot]
rate = 100000
period = 1
burst = 100000

[ratelimit.platforms.telegram.chat]
rate = 100000
period = 1
burst = 100000

[ratelimit.platforms.slack.channel]
rate = 100000
period = 1
burst = 100000
"""
Post = Callable[[str], Awaitable[int]]
_update_ids = itertools.count(5_000_000)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


def telegram_post(http: aiohttp.ClientSession, chat: int, n: int) -> Post:
    update = text_update(f"m{n}", chat_id=chat, update_id=next(_update_ids))

    async def post(url: str) -> int:
        async with http.post(f"{url}/telegram/webhook", json=update,
                             headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}) as r:
            return r.status
    return post


def slack_post(http: aiohttp.ClientSession, channel: str, n: int) -> Post:
    payload = event_callback(event_type="app_mention", text=f"m{n}", channel=channel)

    async def post(url: str) -> int:
        body, headers = signed_json(SLACK_SIGNING_SECRET, payload)
        async with http.post(f"{url}/slack/events", data=body, headers=headers) as r:
            return r.status
    return post


async def deliver(post: Post, fleet: Fleet, deadline: float) -> None:
    """As the platforms do: retry (any replica) until a 2xx, then the chat's next message."""
    while True:
        try:
            if fleet.servers and 200 <= await post(fleet.url()) < 300:
                return
        except (aiohttp.ClientError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError("a message was never acknowledged")
        await asyncio.sleep(0.05)  # a platform's retry delay, not a synchronisation


async def chat_traffic(posts: list[Post], fleet: Fleet, deadline: float) -> None:
    for post in posts:
        await deliver(post, fleet, deadline)


def traffic(http: aiohttp.ClientSession, fleet: Fleet, telegram_chats: int, slack_channels: int,
            per_chat: int, seconds: float) -> asyncio.Future[Any]:
    deadline = time.monotonic() + seconds
    chats = [[telegram_post(http, 7000 + c, n) for n in range(per_chat)]
             for c in range(telegram_chats)]
    chats += [[slack_post(http, f"CCRASH{c}", n) for n in range(per_chat)]
              for c in range(slack_channels)]
    return asyncio.gather(*(chat_traffic(posts, fleet, deadline) for posts in chats))


def answers(telegram: FakeTelegram, slack: FakeSlack, telegram_chats: int,
            slack_channels: int) -> dict[str, list[str]]:
    found = {f"telegram:{7000 + c}": telegram.sent_texts(7000 + c) for c in range(telegram_chats)}
    found.update({f"slack:CCRASH{c}": slack.posted_texts(f"CCRASH{c}")
                  for c in range(slack_channels)})
    return found


def expected(per_chat: int) -> list[str]:
    return [f"echo: m{n} ({2 * n + 1} messages)" for n in range(per_chat)]


def check_answers(found: dict[str, list[str]], per_chat: int) -> int:
    """Every chat answered in order; the number of Telegram replies sent twice (adjacent
    repeats). Slack (whose channel is checked before a retried reply) has none."""
    duplicates = 0
    for chat, texts in found.items():
        collapsed = [t for i, t in enumerate(texts) if i == 0 or t != texts[i - 1]]
        assert collapsed == expected(per_chat), f"{chat}: {texts}"
        extra = len(texts) - len(collapsed)
        assert extra <= (1 if chat.startswith("telegram:") else 0), \
            f"{chat}: a reply sent twice that was not in flight at the kill: {texts}"
        duplicates += extra
    return duplicates


async def check_stored(runtime: Runtime, database_url: str | None, chats: int,
                       per_chat: int) -> None:
    """One conversation per chat holding each user message once, in order."""
    import asyncpg
    conn = await asyncpg.connect(database_url) if database_url else None
    try:
        db: Any = conn or runtime.pg
        rows = await db.fetch(
            "SELECT c.chat, array_agg(m.text ORDER BY m.seq) AS texts FROM conversations c"
            " JOIN conversation_messages m ON m.conversation_id = c.id AND m.role = 'user'"
            " WHERE c.chat LIKE '7%' OR c.chat LIKE 'CCRASH%' GROUP BY c.chat")
    finally:
        if conn is not None:
            await conn.close()
    assert len(rows) == chats
    for row in rows:
        assert row["texts"] == [f"m{n}" for n in range(per_chat)], row["chat"]


async def all_answered(telegram: FakeTelegram, slack: FakeSlack, tg: int, sl: int,
                       per_chat: int) -> bool:
    found = answers(telegram, slack, tg, sl)
    return all(len(set(texts)) >= per_chat for texts in found.values())


@pytest.mark.slow
async def test_kill9_of_every_process_loses_and_reorders_nothing(
        runtime: Runtime, servers: ServerSet, fake_telegram: FakeTelegram,
        fake_slack: FakeSlack, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    tg, sl, per_chat = 50, 20, 10  # 500 Telegram updates, 200 Slack events
    fleet = Fleet(fleet_env(servers, fake_telegram, fake_slack, tmp_path, FAST), tmp_path)
    try:
        await fleet.start(serves=2, workers=1)
        await fleet.wait_ready(http)
        sending = traffic(http, fleet, tg, sl, per_chat, seconds=150)
        await wait_until(lambda: len(fake_telegram.sent_messages()) >= 150, timeout=60,
                         interval=0.01, message="a third of the Telegram replies")
        killed = await fleet.kill_all()
        assert len(killed) == 3
        answered_at_kill = len(fake_telegram.sent_messages()) + len(fake_slack.posted_texts())
        await fleet.start(serves=2, workers=1)
        await fleet.wait_ready(http)
        await sending
        await wait_until(lambda: all_answered(fake_telegram, fake_slack, tg, sl, per_chat),
                         timeout=90, message="every message answered")
        fleet.check_alive()
    finally:
        await fleet.close()
    assert answered_at_kill < (tg + sl) * per_chat  # the kill came mid-traffic
    duplicates = check_answers(answers(fake_telegram, fake_slack, tg, sl), per_chat)
    print(f"replies sent twice (in flight at the kill): {duplicates}")
    await check_stored(runtime, None, tg + sl, per_chat)


@pytest.mark.slow
async def test_postgresql_stopped_for_10_s_loses_nothing(
        runtime: Runtime, servers: ServerSet, fake_telegram: FakeTelegram,
        fake_slack: FakeSlack, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """Events keep being acknowledged while PostgreSQL is down (they are durable in
    redis-durable) and are answered when it returns."""
    tg, sl, per_chat = 20, 10, 10
    pg = embedded.PostgresServer(tmp_path / "pg").start()
    try:
        await migrate_url(pg.url)
        env = fleet_env(servers, fake_telegram, fake_slack, tmp_path, FAST)
        fleet = Fleet({**env, "GATEWAY_DATABASE_URL": pg.url}, tmp_path)
        try:
            await fleet.start(serves=2, workers=0)
            await fleet.wait_ready(http)
            sending = traffic(http, fleet, tg, sl, per_chat, seconds=120)
            await wait_until(lambda: len(fake_telegram.sent_messages()) >= 40, timeout=60,
                             interval=0.01, message="some replies before the outage")
            pg.stop()
            stopped_at = len(fake_telegram.sent_messages())
            await asyncio.sleep(10)  # the fault's duration, as the scenario says
            answered_during = len(fake_telegram.sent_messages()) - stopped_at
            pg.start()
            await sending
            await wait_until(lambda: all_answered(fake_telegram, fake_slack, tg, sl, per_chat),
                             timeout=60, message="every message answered after the outage")
            fleet.check_alive()
        finally:
            await fleet.close()
        assert answered_during <= 2 * 32  # nothing new is stored while PostgreSQL is down
        assert check_answers(answers(fake_telegram, fake_slack, tg, sl), per_chat) == 0
        await check_stored(runtime, pg.url, tg + sl, per_chat)
    finally:
        pg.stop()
