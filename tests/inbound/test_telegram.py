"""Telegram against the fake Bot API, with the real python-telegram-bot, real Redis and
PostgreSQL: webhook secret, dedup, conversations, ordered rate-limited replies under 429s,
long polling, set-webhook, and no token in the logs."""

from __future__ import annotations

import argparse
import asyncio
import bisect
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway import keys, logging_setup
from gateway.cli import _secret_values
from gateway.config import Secret, Settings
from gateway.inbound.telegram import TELEGRAM_BOT, main_set_webhook
from gateway.leases import maintenance
from gateway.stores.runtime import Runtime
from tests.conversations.fast import Apps, with_sections
from tests.fakes import FakeTelegram, text_update
from tests.fakes.pytest_plugin import TELEGRAM_TOKEN
from tests.helpers import wait_until
from tests.inbound.test_webhooks_faults import fill_until_oom

SECRET = "wh-secret_123"
COMPONENTS = ("gateway.web.health", "gateway.inbound.telegram")
HEADER = "X-Telegram-Bot-Api-Secret-Token"


def telegram_settings(settings: Settings, fake: FakeTelegram, **sections: Any) -> Settings:
    return dataclasses.replace(
        with_sections(settings, **sections), telegram_bot_token=Secret(TELEGRAM_TOKEN),
        telegram_webhook_secret=Secret(SECRET), telegram_api_url=fake.api_url)


@pytest.fixture
async def start_bot(runtime: Runtime, settings: Settings, fake_telegram: FakeTelegram,
                    make_client: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """``await start_bot(**sections)`` → a TestClient on an app with a ready Telegram bot."""
    apps = Apps(make_client)

    async def start(polling: bool = False, **sections: Any) -> TestClient[Any, Any]:
        client, app = await apps.start(dataclasses.replace(
            telegram_settings(settings, fake_telegram, **sections), telegram_polling=polling),
            COMPONENTS)
        await wait_until(app[TELEGRAM_BOT].ready.is_set, message="bot ready")
        return client

    yield start
    await apps.close()


async def post(client: TestClient[Any, Any], update: dict[str, Any],
               secret: str | None = SECRET) -> int:
    headers = {HEADER: secret} if secret is not None else {}
    async with client.post("/telegram/webhook", json=update, headers=headers) as response:
        await response.read()
        return response.status


async def test_webhook_round_trip_and_duplicates(start_bot: Callable[..., Any],
                                                 fake_telegram: FakeTelegram,
                                                 runtime: Runtime) -> None:
    client = await start_bot()
    update = text_update("hello", chat_id=777)
    # Delivered twice at once, then once more later: one reply.
    assert await asyncio.gather(post(client, update), post(client, update)) == [200, 200]
    await fake_telegram.wait_for_messages(1, chat_id=777)
    assert await post(client, update) == 200
    other = text_update("second", chat_id=777)
    assert await post(client, other) == 200
    await fake_telegram.wait_for_messages(2, chat_id=777)
    assert fake_telegram.sent_texts(777) == ["echo: hello (1 messages)",
                                             "echo: second (3 messages)"]
    bot_id = fake_telegram.bot_user["id"]
    key = keys.dedup_telegram_update(bot_id, update["update_id"])
    await wait_until(lambda: runtime.durable.get(key), message="claim marked done")
    assert await runtime.durable.get(key) == "done"
    assert 0 < await runtime.durable.ttl(key) <= 86400
    assert await runtime.pg.fetchval("SELECT count(*) FROM conversation_messages") == 4


async def test_wrong_or_missing_secret_is_refused(start_bot: Callable[..., Any],
                                                  fake_telegram: FakeTelegram,
                                                  runtime: Runtime) -> None:
    client = await start_bot()
    for secret in ("wrong", "", None, SECRET + "x"):
        async with client.post("/telegram/webhook", json=text_update("sneaky"),
                               headers={HEADER: secret} if secret is not None else {}) as r:
            assert r.status == 403
            assert (await r.json())["error"] == "forbidden"
    async with client.post("/telegram/webhook", data=b"{not json",
                           headers={HEADER: SECRET}) as r:
        assert r.status == 400 and (await r.json())["error"] == "bad_request"
    assert await post(client, {"update_id": "x"}) == 400
    assert fake_telegram.sent_messages() == []
    assert await runtime.pg.fetchval("SELECT count(*) FROM conversation_messages") == 0
    assert [k async for k in runtime.durable.scan_iter("dedup:*")] == []  # nothing claimed


async def test_repeated_wrong_secrets_trip_the_barrier(start_bot: Callable[..., Any],
                                                       fake_telegram: FakeTelegram) -> None:
    client = await start_bot(security={"brute_max_failures": 3, "brute_cooldown": 60})
    statuses = [await post(client, text_update("guess"), secret=f"guess{i}") for i in range(4)]
    assert statuses == [403, 403, 429, 429]
    assert await post(client, text_update("now right")) == 429  # blocked, even when right
    assert fake_telegram.sent_messages() == []


async def test_new_switches_and_cache_flush_keeps_conversation(
        start_bot: Callable[..., Any], fake_telegram: FakeTelegram, runtime: Runtime) -> None:
    client = await start_bot()
    await post(client, text_update("one", chat_id=55))
    await fake_telegram.wait_for_messages(1, chat_id=55)
    await runtime.cache.flushall()  # evicted pointer: same conversation, not /new
    await post(client, text_update("two", chat_id=55))
    await fake_telegram.wait_for_messages(2, chat_id=55)
    await post(client, text_update("/new", chat_id=55))
    await fake_telegram.wait_for_messages(3, chat_id=55)
    await post(client, text_update("three", chat_id=55))
    await fake_telegram.wait_for_messages(4, chat_id=55)
    texts = fake_telegram.sent_texts(55)
    assert texts[:2] == ["echo: one (1 messages)", "echo: two (3 messages)"]
    assert texts[2].startswith("Started a new conversation")
    assert texts[3] == "echo: three (3 messages)"
    counts = [r["message_count"] for r in await runtime.pg.fetch(
        "SELECT message_count FROM conversations ORDER BY id")]
    assert counts == [4, 4]


async def test_non_text_updates_are_acknowledged_and_ignored(
        start_bot: Callable[..., Any], fake_telegram: FakeTelegram, runtime: Runtime) -> None:
    client = await start_bot()
    edited = text_update("edited")
    edited["edited_message"] = edited.pop("message")
    assert await post(client, edited) == 200
    assert await post(client, text_update("real", chat_id=9)) == 200
    await fake_telegram.wait_for_messages(1, chat_id=9)
    assert fake_telegram.sent_texts() == ["echo: real (1 messages)"]


def max_in_any_window(times: list[float], period: float) -> int:
    times = sorted(times)
    return max(bisect.bisect_left(times, t + period) - i for i, t in enumerate(times))


@pytest.mark.slow
async def test_hundred_messages_in_order_within_chat_limit_despite_429(
        start_bot: Callable[..., Any], fake_telegram: FakeTelegram, runtime: Runtime) -> None:
    rate = 50  # per chat per second: a fast stand-in for Telegram's 1/s, same mechanism
    limits = {"platforms": {"telegram": {"chat": {"rate": rate, "period": 1, "burst": 1},
                                         "bot": {"rate": 1000, "period": 1, "burst": 1000}}}}
    client = await start_bot(ratelimit=limits)
    fake_telegram.fail_next("sendMessage", status=429, retry_after=1, count=2)
    for i in range(100):
        assert await post(client, text_update(f"m{i}", chat_id=4242)) == 200
    await fake_telegram.wait_for_messages(102, chat_id=4242, timeout=30)
    calls = fake_telegram.calls_to("sendMessage")
    assert len(calls) == 102  # two were answered 429 and sent again after Retry-After
    words = [str(c.params["text"]).split()[1] for c in calls]
    assert words[:2] == ["m0", "m0"]  # the 429s, each resent after its Retry-After
    assert words[2:] == [f"m{i}" for i in range(100)]  # none lost, in order
    times = [c.time for c in calls]
    assert max_in_any_window(times, 1.0) <= rate + 1  # +1: arrival jitter at the fake
    assert times[2] - times[0] >= 1.9  # each 429 waited its Retry-After of 1 s
    assert await runtime.pg.fetchval("SELECT count(*) FROM undelivered_replies") == 0


async def test_failed_sends_are_dead_lettered(start_bot: Callable[..., Any],
                                              fake_telegram: FakeTelegram,
                                              runtime: Runtime) -> None:
    client = await start_bot()
    fake_telegram.fail_next("sendMessage", status=502, count=3)  # attempts = 3 in tests
    await post(client, text_update("doomed", chat_id=31))
    await wait_until(lambda: runtime.pg.fetchval("SELECT count(*) FROM undelivered_replies"),
                     message="dead letter row")
    row = await runtime.pg.fetchrow("SELECT chat, text, attempts FROM undelivered_replies")
    assert dict(row) == {"chat": "31", "text": "echo: doomed (1 messages)", "attempts": 3}
    fake_telegram.fail_next("sendMessage", status=403)  # blocked: no point retrying
    await post(client, text_update("blocked", chat_id=32))
    await wait_until(lambda: runtime.pg.fetchval(
        "SELECT count(*) FROM undelivered_replies WHERE chat = '32'"), message="blocked row")
    assert len(fake_telegram.sent_messages(32)) == 1


async def test_long_polling(start_bot: Callable[..., Any], fake_telegram: FakeTelegram,
                            runtime: Runtime) -> None:
    await start_bot(polling=True, telegram={"poll_timeout": 1})
    update = text_update("polled", chat_id=88)
    fake_telegram.push_update(update)
    fake_telegram.push_update(update)  # the same update twice: one answer
    await fake_telegram.wait_for_messages(1, chat_id=88)
    fake_telegram.push_update(text_update("again", chat_id=88))
    await fake_telegram.wait_for_messages(2, chat_id=88)
    assert fake_telegram.sent_texts(88) == ["echo: polled (1 messages)",
                                            "echo: again (3 messages)"]
    assert "deleteWebhook" in fake_telegram.method_names()


async def test_set_webhook_registers_the_secret(settings: Settings,
                                                fake_telegram: FakeTelegram) -> None:
    configured = telegram_settings(settings, fake_telegram)
    args = argparse.Namespace(url="https://gw.example/telegram/webhook")
    assert await asyncio.to_thread(main_set_webhook, args, configured) == 0
    assert fake_telegram.webhook_url == "https://gw.example/telegram/webhook"
    assert fake_telegram.webhook.get("secret_token") == SECRET


async def test_token_never_reaches_the_logs(start_bot: Callable[..., Any],
                                            fake_telegram: FakeTelegram,
                                            settings: Settings,
                                            capfd: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configured = telegram_settings(settings, fake_telegram)
        logging_setup.configure(_secret_values(configured), level="DEBUG")
        client = await start_bot()
        await post(client, text_update("log me", chat_id=61))
        await fake_telegram.wait_for_messages(1, chat_id=61)
        fake_telegram.fail_next("sendMessage", status=502, count=1)
        await post(client, text_update("fail once", chat_id=61))
        await fake_telegram.wait_for_messages(3, chat_id=61)
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    err = capfd.readouterr().err
    assert "sendMessage" in err  # PTB's debug log of the calls was captured...
    assert "send failed" in err  # ...and our retry warning
    assert TELEGRAM_TOKEN not in err and TELEGRAM_TOKEN.split(":")[1] not in err


async def test_full_durable_store_is_backpressure_then_the_retry_is_answered(
        runtime: Runtime, settings: Settings, fake_telegram: FakeTelegram,
        make_client: Callable[..., Any], redis_factory: Callable[..., Any]) -> None:
    """redis-durable at maxmemory: the webhook answers 503 + Retry-After (Telegram retries),
    nothing is half-claimed, and the retry after space is freed gets exactly one reply."""
    small = redis_factory("durable", maxmemory="4mb")
    apps = Apps(make_client)
    try:
        client, app = await apps.start(dataclasses.replace(
            telegram_settings(settings, fake_telegram), durable_url=small.url), COMPONENTS)
        await wait_until(app[TELEGRAM_BOT].ready.is_set, message="bot ready")
        durable = app[TELEGRAM_BOT].runtime.durable
        filler = await fill_until_oom(durable)
        update = text_update("under pressure", chat_id=71)
        async with client.post("/telegram/webhook", json=update,
                               headers={HEADER: SECRET}) as refused:
            assert refused.status == 503 and int(refused.headers["Retry-After"]) > 0
            assert (await refused.json())["error"] == "backpressure"
        bot_id = fake_telegram.bot_user["id"]
        assert not await durable.exists(keys.dedup_telegram_update(bot_id, update["update_id"]))
        await durable.delete(*(f"filler:{i}" for i in range(filler)))
        assert await post(client, update) == 200  # Telegram's retry
        await fake_telegram.wait_for_messages(1, chat_id=71)
        assert fake_telegram.sent_texts(71) == ["echo: under pressure (1 messages)"]
    finally:
        await apps.close()


async def slow_handler(ctx: Any) -> str | None:
    await asyncio.sleep(0.5)  # far longer than posting the three updates takes
    return f"slow: {ctx.incoming.text}"


async def test_graceful_stop_finishes_the_message_in_hand_and_keeps_the_rest(
        start_bot: Callable[..., Any], fake_telegram: FakeTelegram, runtime: Runtime) -> None:
    """Telegram got its 200 for each update: stopping the app answers the message being
    handled, leaves the others in the inbox, and the next start answers them, once each and
    in order."""
    handler = {"handler": "tests.inbound.test_telegram:slow_handler"}
    client = await start_bot(conversations=handler)
    for i in range(3):
        assert await post(client, text_update(f"late{i}", chat_id=90)) == 200
    assert fake_telegram.sent_messages(90) == []  # still being handled
    await client.close()  # the consumer finishes what it holds and gives the chat back
    answered = fake_telegram.sent_texts(90)
    assert answered == [f"slow: late{i}" for i in range(len(answered))] and answered
    await start_bot(conversations=handler)
    await fake_telegram.wait_for_messages(3, chat_id=90)
    assert fake_telegram.sent_texts(90) == [f"slow: late{i}" for i in range(3)]
    claims = [await runtime.durable.get(k) async for k in
              runtime.durable.scan_iter("dedup:telegram-update:*")]
    assert claims == ["done"] * 3


async def test_unreachable_bot_api_at_start_is_retried(
        runtime: Runtime, settings: Settings, fake_telegram: FakeTelegram,
        make_client: Callable[..., Any]) -> None:
    """getMe failing at start-up keeps only the bot waiting (503 to Telegram, which retries),
    not the gateway; the bot comes up when the Bot API answers."""
    fake_telegram.fail_next("getMe", status=502, count=10_000)  # down until cleared
    apps = Apps(make_client)
    try:
        client, app = await apps.start(telegram_settings(
            settings, fake_telegram, telegram={"init_retry_seconds": 0.05}), COMPONENTS)
        async with client.get("/healthz") as health:
            assert health.status == 200  # the rest of the gateway serves meanwhile
        async with client.post("/telegram/webhook", json=text_update("early"),
                               headers={HEADER: SECRET}) as early:
            assert early.status == 503 and early.headers["Retry-After"]
        await fake_telegram.wait_for_calls("getMe", 3)  # retried, paced
        async with client.get("/readyz") as ready:  # shown, but not required
            body = await ready.json()
            assert ready.status == 200 and body["checks"]["telegram"]["ok"] is False
        fake_telegram.clear_faults()
        await wait_until(app[TELEGRAM_BOT].ready.is_set, message="bot ready after retries")
        async with client.get("/readyz") as ready:
            assert (await ready.json())["checks"]["telegram"]["ok"] is True
        assert await post(client, text_update("later", chat_id=12)) == 200
        await fake_telegram.wait_for_messages(1, chat_id=12)
    finally:
        await apps.close()


async def test_maintenance_refuses_updates_until_it_ends(
        start_bot: Callable[..., Any], fake_telegram: FakeTelegram, runtime: Runtime) -> None:
    """Telegram retries a 503 later: nothing is accepted (so nothing a restore could lose),
    and the retry after the end is answered."""
    client = await start_bot()
    await maintenance.switch_on(runtime.durable, "restore", seconds=120)
    # Each process sees the switch within its refresh interval: probe until it does.
    await wait_until(lambda: _status_is(client, text_update("probe", chat_id=900), 503),
                     timeout=2)
    update = text_update("during maintenance", chat_id=901)
    assert await post(client, update) == 503
    assert fake_telegram.sent_texts(901) == []
    await maintenance.switch_off(runtime.durable)
    await wait_until(lambda: _status_is(client, update, 200), timeout=2)
    await wait_until(lambda: fake_telegram.sent_texts(), timeout=10, message="answered")


async def _status_is(client: TestClient[Any, Any], update: dict[str, Any], status: int) -> bool:
    return await post(client, update) == status


async def test_a_secret_header_that_is_not_ascii_is_a_counted_403(
        start_bot: Callable[..., Any], runtime: Runtime,
        caplog: pytest.LogCaptureFixture) -> None:
    """Once an unhandled 500 that the barrier never counted (issue 24 point 8)."""
    from gateway.security.brute import fail_key
    from tests.web.test_malformed import raw, raw_request

    client = await start_bot()
    caplog.set_level(logging.INFO)
    body = json.dumps(text_update("sneaky")).encode()
    for value in (b"\xc3\xa9t\xc3\xa9", b"\xff\xfe", SECRET.encode() + b"\xff"):
        status, _, answer = await raw_request(client, raw(
            "POST", "/telegram/webhook", HEADER.encode() + b": " + value,
            b"Content-Type: application/json",
            f"Content-Length: {len(body)}".encode()) + body)
        assert status == 403 and json.loads(answer)["error"] == "forbidden"
    assert int(await runtime.durable.get(fail_key("127.0.0.1")) or 0) == 3
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
