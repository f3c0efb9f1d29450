"""redis-durable going away while a reply is sent, against the Telegram fake with the real
bot library, real Redis (a durable instance of its own, stopped and started again) and
PostgreSQL: the reply is no send failure. It is neither retried against the dead store nor
dead-lettered; the chat is given back and the stored reply is sent once the store is back."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from gateway.config import Settings
from gateway.conversations.model import Incoming
from gateway.inbox.fence import Fence, fenced_send
from gateway.inbox.queue import Inbox
from gateway.outbound.delivery import RetryPolicy, deliver
from gateway.outbound.errors import StoreOutage
from gateway.ratelimit import Limiter
from gateway.stores import redis as redis_clients
from gateway.stores.runtime import Runtime
from tests.conversations import gated
from tests.conversations.platforms import TelegramChat, bot_replies
from tests.conversations.test_lost_lease import consumer_of, idle, undelivered
from tests.fakes import FakeTelegram
from tests.helpers import wait_until


@pytest.mark.slow
@pytest.mark.single_instance
async def test_a_durable_outage_while_the_reply_is_sent_dead_letters_nothing(
        runtime: Runtime, settings: Settings, fake_telegram: FakeTelegram,
        make_client: Callable[..., Any], redis_factory: Callable[..., Any],
        gates: gated.Gates) -> None:
    durable = redis_factory("durable")
    chat = TelegramChat(dataclasses.replace(settings, durable_url=durable.url), fake_telegram,
                        make_client)
    try:
        await chat.start(gated.sections())
        consumer = consumer_of(chat)
        await chat.say("question")
        await wait_until(gates.entered[1].is_set, message="the handler runs")
        durable.stop()  # the limiter's buckets and the fence are out of reach
        gates.opened[1].set()  # the reply is stored (PostgreSQL), then sent: the outage
        await wait_until(lambda: bot_replies(runtime), message="the reply stored")
        await wait_until(lambda: not consumer.held, timeout=10,
                         message="the holder stepped out of the chat")
        assert await undelivered(runtime) == 0  # not a send failure: nothing dead-lettered
        durable.start()
        await chat.wait_for_text("reply 1")  # the next holder sends the stored reply
        await wait_until(lambda: idle(consumer), message="the message acknowledged")
    finally:
        await chat.stop()
    assert fake_telegram.sent_texts(TelegramChat.chat_id) == ["reply 1"]
    assert gates.runs == 1  # stored once: the retry sends it, no second answer
    assert await undelivered(runtime) == 0


@pytest.mark.single_instance
async def test_an_unreachable_fence_is_an_outage_not_a_send_failure(
        runtime: Runtime, redis_factory: Callable[..., Any]) -> None:
    """No bucket to pass (the last edit of a reply the chat shows whole already): the fence
    inside ``send`` is what meets the outage. ``deliver`` hands it to its caller at once,
    sends nothing and dead-letters nothing."""
    server = redis_factory("durable")
    durable = redis_clients.connect(server.url, variable="test")
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    fence = Fence(Inbox(durable, "telegram"), "777", "a-token", "an entry", lambda exc: None)
    incoming = Incoming(platform="telegram", chat="777", thread=None, user_id="1",
                        user_name="alice", text="question", message_id="1")
    try:
        server.stop()
        with pytest.raises(StoreOutage):
            await deliver(runtime.pg, Limiter(durable), [], incoming, "reply",
                          fenced_send(fence, send), RetryPolicy(attempts=3, backoff=0.01))
    finally:
        await durable.aclose()
    assert sent == []
    assert await undelivered(runtime) == 0
