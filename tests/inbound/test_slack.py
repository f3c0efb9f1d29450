"""Slack against the fake Web API, with the real slack-bolt AsyncApp, real Redis and
PostgreSQL: signatures and timestamps, url_verification, dedup of retries (also while the
first delivery still runs), mentions, DMs, threads, /new, slash commands, 429s."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway import keys
from gateway.config import Secret, Settings
from gateway.conversations.handlers import Context, default_handler
from gateway.stores.runtime import Runtime
from tests.conversations.fast import Apps, with_sections
from tests.fakes import FakeSlack, event_callback, slash_command_body
from tests.fakes.pytest_plugin import SLACK_TOKEN
from tests.fakes.slack import CHANNEL_ID, TEAM_ID, signed_form, signed_json, url_verification
from tests.helpers import wait_until

SIGNING_SECRET = "slack-signing-secret"
COMPONENTS = ("gateway.web.health", "gateway.inbound.slack")


async def slow_handler(ctx: Context) -> str | None:
    """Longer than Slack's 3 s patience would allow if we answered after the work."""
    await asyncio.sleep(1.0)
    return await default_handler(ctx)


@pytest.fixture
async def start_bot(runtime: Runtime, settings: Settings, fake_slack: FakeSlack,
                    make_client: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """``await start_bot(**sections)`` → a TestClient on an app with the Slack bot."""
    apps = Apps(make_client)

    async def start(**sections: Any) -> TestClient[Any, Any]:
        client, _ = await apps.start(dataclasses.replace(
            with_sections(settings, **sections), slack_bot_token=Secret(SLACK_TOKEN),
            slack_signing_secret=Secret(SIGNING_SECRET), slack_api_url=fake_slack.api_url),
            COMPONENTS)
        return client

    yield start
    await apps.close()


async def send_event(client: TestClient[Any, Any], payload: dict[str, Any],
                     secret: str = SIGNING_SECRET, timestamp: int | None = None,
                     retry: int | None = None) -> tuple[int, Any]:
    body, headers = signed_json(secret, payload, timestamp)
    if retry:
        headers = {**headers, "X-Slack-Retry-Num": str(retry),
                   "X-Slack-Retry-Reason": "http_timeout"}
    async with client.post("/slack/events", data=body, headers=headers) as response:
        text = await response.text()
        return response.status, text


async def test_url_verification(start_bot: Callable[..., Any]) -> None:
    client = await start_bot()
    status, text = await send_event(client, url_verification("chal-123"))
    assert status == 200 and json.loads(text) == {"challenge": "chal-123"}


async def test_bad_signature_and_stale_timestamp_are_refused(
        start_bot: Callable[..., Any], fake_slack: FakeSlack, runtime: Runtime) -> None:
    client = await start_bot()
    payload = event_callback(event_type="app_mention", text="sneaky")
    for kwargs, error in (({"secret": "wrong"}, "unauthorized"),
                          ({"timestamp": int(time.time()) - 301}, "stale_signature")):
        status, text = await send_event(client, payload, **kwargs)
        assert status == 401
        assert json.loads(text)["error"] == error
    async with client.post("/slack/events", data=b"{}") as response:  # unsigned
        assert response.status == 401
    assert fake_slack.posted_messages() == []
    assert [k async for k in runtime.durable.scan_iter("dedup:*")] == []  # nothing claimed


async def test_repeated_bad_signatures_trip_the_barrier(start_bot: Callable[..., Any],
                                                        fake_slack: FakeSlack) -> None:
    client = await start_bot(security={"brute_max_failures": 2, "brute_cooldown": 60})
    payload = event_callback(event_type="app_mention", text="guess")
    statuses = [(await send_event(client, payload, secret="wrong"))[0] for _ in range(3)]
    assert statuses == [401, 429, 429]
    assert (await send_event(client, payload))[0] == 429  # blocked, even when signed right
    assert fake_slack.posted_messages() == []


async def test_mention_answered_once_despite_retries(start_bot: Callable[..., Any],
                                                     fake_slack: FakeSlack,
                                                     runtime: Runtime) -> None:
    client = await start_bot()
    payload = event_callback(event_type="app_mention", text="hello")
    first, second = await asyncio.gather(send_event(client, payload),
                                         send_event(client, payload, retry=1))
    assert first[0] == second[0] == 200
    await fake_slack.wait_for_posts(1, CHANNEL_ID)
    assert (await send_event(client, payload, retry=2))[0] == 200
    other = event_callback(event_type="app_mention", text="again")
    await send_event(client, other)
    await fake_slack.wait_for_posts(2, CHANNEL_ID)
    assert fake_slack.posted_texts(CHANNEL_ID) == ["echo: hello (1 messages)",
                                                   "echo: again (3 messages)"]
    key = keys.dedup_slack_event(payload["event_id"])
    await wait_until(lambda: runtime.durable.get(key), message="claim")
    assert await runtime.durable.get(key) == "done"


@pytest.mark.slow
async def test_acknowledged_at_once_and_retry_while_running_is_not_answered_twice(
        start_bot: Callable[..., Any], fake_slack: FakeSlack) -> None:
    client = await start_bot(conversations={
        "handler": "tests.inbound.test_slack:slow_handler"})
    payload = event_callback(event_type="app_mention", text="slow")
    started = time.monotonic()
    status, _ = await send_event(client, payload)
    assert status == 200 and time.monotonic() - started < 0.5  # the 1 s handler runs after
    assert (await send_event(client, payload, retry=1))[0] == 200  # arrives mid-handling
    # One chat is handled in order, so a second answer to "slow" would come before this one.
    await send_event(client, event_callback(event_type="app_mention", text="next"))
    await fake_slack.wait_for_posts(2, CHANNEL_ID)
    assert fake_slack.posted_texts(CHANNEL_ID) == ["echo: slow (1 messages)",
                                                   "echo: next (3 messages)"]


async def test_direct_messages_threads_and_ignored_events(start_bot: Callable[..., Any],
                                                          fake_slack: FakeSlack) -> None:
    client = await start_bot()
    await send_event(client, event_callback(text="just chatting"))  # channel, no mention
    await send_event(client, event_callback(text="edit", subtype="message_changed"))
    await send_event(client, event_callback(text="dm", channel="D0DM", channel_type="im"))
    await send_event(client, event_callback(event_type="app_mention", text="in thread",
                                            thread_ts="1700000000.000100"))
    await fake_slack.wait_for_posts(1, "D0DM")
    await fake_slack.wait_for_posts(1, CHANNEL_ID)
    assert fake_slack.posted_texts("D0DM") == ["echo: dm (1 messages)"]
    [threaded] = fake_slack.posted_messages(CHANNEL_ID)
    assert threaded["text"] == "echo: in thread (1 messages)"
    assert threaded["thread_ts"] == "1700000000.000100"


async def test_new_switches_and_cache_flush_keeps_conversation(
        start_bot: Callable[..., Any], fake_slack: FakeSlack, runtime: Runtime) -> None:
    client = await start_bot()

    async def say(text: str, count: int) -> None:
        await send_event(client, event_callback(event_type="app_mention", text=text))
        await fake_slack.wait_for_posts(count, CHANNEL_ID)

    await say("one", 1)
    assert await runtime.cache.exists(keys.slack_active_conv(TEAM_ID, CHANNEL_ID))
    await runtime.cache.flushall()
    await say("two", 2)
    await say("/new", 3)
    await say("three", 4)
    texts = fake_slack.posted_texts(CHANNEL_ID)
    assert texts[1] == "echo: two (3 messages)"
    assert texts[2].startswith("Started a new conversation")
    assert texts[3] == "echo: three (3 messages)"


async def test_slash_command(start_bot: Callable[..., Any], fake_slack: FakeSlack) -> None:
    client = await start_bot()
    for text in ("hi there", "status"):
        body, headers = signed_form(SIGNING_SECRET, slash_command_body(
            "/gw", text, response_url=fake_slack.new_response_url()))
        async with client.post("/slack/commands", data=body, headers=headers) as response:
            assert response.status == 200
    responses = await fake_slack.wait_for_responses(2)
    assert responses[0]["text"] == "echo: hi there (1 messages)"
    assert responses[1]["text"].endswith(": 3 messages.")
    assert {r["response_type"] for r in responses} == {"in_channel"}


async def test_platform_429_is_retried(start_bot: Callable[..., Any],
                                       fake_slack: FakeSlack, runtime: Runtime) -> None:
    client = await start_bot()
    fake_slack.fail_next("chat.postMessage", status=429, retry_after=1)
    await send_event(client, event_callback(event_type="app_mention", text="limited"))
    await fake_slack.wait_for_posts(2, CHANNEL_ID, timeout=10)
    first, second = fake_slack.calls_to("chat.postMessage")
    assert second.time - first.time >= 0.95  # waited the Retry-After
    assert second.params["text"] == "echo: limited (1 messages)"
    assert await runtime.pg.fetchval("SELECT count(*) FROM undelivered_replies") == 0
    fake_slack.fail_next("chat.postMessage", status=200, error="channel_not_found")
    await send_event(client, event_callback(event_type="app_mention", text="gone"))
    await wait_until(lambda: runtime.pg.fetchval("SELECT count(*) FROM undelivered_replies"),
                     message="dead letter")
    assert len(fake_slack.calls_to("chat.postMessage")) == 3  # permanent: no retries


@pytest.mark.parametrize("counted", [True, False])
async def test_a_retried_reply_already_in_the_channel_is_not_posted_again(
        runtime: Runtime, settings: Settings, fake_slack: FakeSlack,
        make_client: Callable[..., Any], counted: bool) -> None:
    """A holder posted the reply and died (a counted failure), or gave the chat back
    uncounted (a store outage, a shutdown), before recording it; 250 messages were posted in
    the channel since. The next holder finds the reply (its metadata names the message)
    among them, past the first page of 200, and posts nothing."""
    from gateway.conversations.model import chat_key
    from gateway.inbound.slack import SLACK_BOT, _incoming
    from gateway.inbox.entry import Entry
    apps = Apps(make_client)
    try:
        client, app = await apps.start(dataclasses.replace(
            with_sections(settings), slack_bot_token=Secret(SLACK_TOKEN),
            slack_signing_secret=Secret(SIGNING_SECRET), slack_api_url=fake_slack.api_url),
            COMPONENTS)
        payload = event_callback(event_type="app_mention", text="once only")
        assert (await send_event(client, payload))[0] == 200
        [reply] = await fake_slack.wait_for_posts(1, channel=CHANNEL_ID)
        event = payload["event"]
        assert reply["metadata"] == {"event_type": "gateway_reply",
                                     "event_payload": {"reply_to": event["ts"]}}
        # The first handling over (settled, its entry acknowledged and the chat given up),
        # so the entry pushed below waits for a taker rather than following it at once.
        queue = app[SLACK_BOT].inbox.queue
        await wait_until(lambda: _settled(runtime), timeout=10, message="settled")
        await wait_until(lambda: _idle(queue), timeout=10, message="chat given up")
        # The dead holder's state: the reply sent but not recorded as settled, the entry
        # back at the head of its chat with one failed attempt behind it.
        incoming = _incoming(payload, event)
        assert incoming is not None
        for _ in range(5):
            await runtime.pg.execute("UPDATE conversation_messages SET settled_at = NULL"
                                     " WHERE role = 'bot'")
            await queue.push(chat_key(incoming), Entry(incoming), None, 60)  # no wake-up:
            taken = await queue.take("dead-holder", 1)  # the consumer polls every 0.25 s
            if taken:
                break
            # The app's consumer polled in between (a loaded machine) and holds the entry:
            # let it finish (it finds the reply on the first page), then set the state again.
            await wait_until(lambda: _settled(runtime), timeout=10, message="settled")
            await wait_until(lambda: _idle(queue), timeout=10, message="chat given up")
        assert taken, "the app's consumer took the entry first five times"
        for n in range(250):  # a busy channel since: the reply is not on the first page
            fake_slack.add_message(CHANNEL_ID, f"chatter {n}")
        pages_before = len(fake_slack.calls_to("conversations.history"))
        await queue.release(taken[0].chat, "dead-holder", delay=0, counted=counted)
        await wait_until(lambda: _settled(runtime), timeout=10, message="settled again")
        assert fake_slack.posted_texts(CHANNEL_ID) == [reply["text"]]
        # two pages read
        assert len(fake_slack.calls_to("conversations.history")) - pages_before == 2
    finally:
        await apps.close()


async def _idle(queue: Any) -> bool:
    return (await queue.depth())["leased_chats"] == 0


async def _settled(runtime: Runtime) -> bool:
    return bool(await runtime.pg.fetchval(
        "SELECT bool_and(settled_at IS NOT NULL) FROM conversation_messages WHERE role = 'bot'"))
