"""Telegram long polling against the fake Bot API, with real Redis and PostgreSQL: an update
is confirmed to Telegram only once it is stored, so one the inbox refused (a full chat,
redis-durable out of reach) is fetched again and answered once, in order."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.config import Settings
from gateway.inbound.telegram import TELEGRAM_BOT
from gateway.stores.runtime import Runtime
from tests.conversations import gated
from tests.conversations.fast import Apps
from tests.fakes import FakeTelegram, text_update
from tests.helpers import wait_until
from tests.inbound.test_telegram import COMPONENTS, telegram_settings

CHAT = 88
POLLING = {"poll_timeout": 1, "poll_retry_seconds": 0.1}


@pytest.fixture
async def start_polling(settings: Settings, fake_telegram: FakeTelegram,
                        make_client: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """``await start_polling(settings, **sections)``: an app whose bot long-polls the fake."""
    apps = Apps(make_client)

    async def start(base: Settings = settings, **sections: Any) -> None:
        _, app = await apps.start(dataclasses.replace(
            telegram_settings(base, fake_telegram, telegram=POLLING, **sections),
            telegram_polling=True), COMPONENTS)
        await wait_until(app[TELEGRAM_BOT].ready.is_set, message="bot ready")

    yield start
    await apps.close()


def polled_offsets(fake: FakeTelegram) -> list[int]:
    return [int(call.params.get("offset") or 0) for call in fake.get_updates_calls()]


async def test_an_update_refused_by_a_full_chat_is_fetched_again_and_answered_once(
        runtime: Runtime, fake_telegram: FakeTelegram,
        start_polling: Callable[..., Any]) -> None:
    """A chat holds at most 2 waiting entries (``max_per_chat``): the third update of a chat
    whose first is still being answered is refused, stays unconfirmed, and is stored once
    the chat has room."""
    with gated.fresh() as gates:
        await start_polling(conversations={"handler": "tests.conversations.gated:handler"},
                            inbox={"max_per_chat": 2, "poll_seconds": 0.05})
        ids = [fake_telegram.push_update(text_update(f"q{i}", chat_id=CHAT)) for i in range(3)]
        await wait_until(gates.entered[1].is_set, message="the first update is answered")
        await wait_until(lambda: polled_offsets(fake_telegram).count(ids[2]) >= 2,
                         message="the refused third update fetched again")
        assert ids[2] in [u["update_id"] for u in fake_telegram.pending_updates]
        for run in (1, 2, 3):
            gates.opened[run].set()
        await fake_telegram.wait_for_messages(3, chat_id=CHAT)
        await wait_until(lambda: not fake_telegram.pending_updates or None, timeout=5,
                         message="every update confirmed")
    assert fake_telegram.sent_texts(CHAT) == ["reply 1", "reply 2", "reply 3"]
    assert gates.runs == 3


@pytest.mark.single_instance
async def test_an_update_polled_while_the_store_is_down_is_fetched_again_and_answered_once(
        runtime: Runtime, settings: Settings, fake_telegram: FakeTelegram,
        start_polling: Callable[..., Any], redis_factory: Callable[..., Any]) -> None:
    durable = redis_factory("durable")
    await start_polling(dataclasses.replace(settings, durable_url=durable.url))
    durable.stop()
    polls = len(fake_telegram.get_updates_calls())
    update_id = fake_telegram.push_update(text_update("while the store is down",
                                                      chat_id=CHAT))
    await wait_until(lambda: len(fake_telegram.get_updates_calls()) >= polls + 3,
                     message="polled again while the update could not be stored")
    assert [u["update_id"] for u in fake_telegram.pending_updates] == [update_id]
    durable.start()
    await fake_telegram.wait_for_messages(1, chat_id=CHAT, timeout=10)
    await wait_until(lambda: not fake_telegram.pending_updates or None, timeout=5,
                     message="the update confirmed")
    assert fake_telegram.sent_texts(CHAT) == ["echo: while the store is down (1 messages)"]
