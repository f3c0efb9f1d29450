"""A chat's holder that loses its lease mid-handler, against the Telegram fake with the real
bot library, real Redis and PostgreSQL: the reply it stored is sent once, by the next
holder, and nothing ends in the dead letters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.config import Settings
from gateway.inbound.telegram import TELEGRAM_BOT
from gateway.inbox.consumer import InboxConsumer
from gateway.stores.runtime import Runtime
from tests.conversations import gated
from tests.conversations.platforms import TelegramChat, bot_replies
from tests.fakes import FakeTelegram
from tests.helpers import wait_until


def consumer_of(chat: TelegramChat) -> InboxConsumer:
    return chat.client.server.app[TELEGRAM_BOT].inbox.consumer  # type: ignore[no-any-return]


async def undelivered(runtime: Runtime) -> int:
    return int(await runtime.pg.fetchval("SELECT count(*) FROM undelivered_replies"))


async def settled(runtime: Runtime) -> bool:
    return bool(await runtime.pg.fetchval(
        "SELECT settled_at IS NOT NULL FROM conversation_messages WHERE role = 'bot'"))


async def test_a_reply_stored_by_a_holder_that_lost_the_chat_is_sent_once_by_the_next(
        runtime: Runtime, settings: Settings, fake_telegram: FakeTelegram,
        make_client: Callable[..., Any], gates: gated.Gates) -> None:
    """Holder A stalls in the handler past its lease (it renews nothing), B reclaims the chat
    and runs the handler too; A stores its reply and is fenced before sending it; B's reply
    finds A's stored: B sends that one (the stored reply is the answer), once."""
    chat = TelegramChat(settings, fake_telegram, make_client)
    try:
        await chat.start(gated.sections())
        consumer = consumer_of(chat)
        renew = consumer.inbox.renew

        async def stalled(held: dict[str, str]) -> set[str]:
            return set()  # A's renewals never arrive

        consumer.inbox.renew = stalled  # type: ignore[method-assign]
        await chat.say("question")
        await wait_until(gates.entered[1].is_set, message="A runs the handler")
        await wait_until(gates.entered[2].is_set, timeout=gated.LEASE_SECONDS * 3,
                         message="A's lease ran out and B runs the handler too")
        consumer.inbox.renew = renew  # type: ignore[method-assign]  # B renews
        gates.opened[1].set()  # A stores "reply 1", then meets the fence
        await wait_until(lambda: bot_replies(runtime), message="A's reply stored")
        gates.opened[2].set()  # B's "reply 2" finds A's stored
        await chat.wait_for_text("reply 1")
        await wait_until(lambda: settled(runtime), message="the reply settled")
        await wait_until(lambda: idle(consumer), message="the message acknowledged")
    finally:
        await chat.stop()
    assert fake_telegram.sent_texts(TelegramChat.chat_id) == ["reply 1"]
    assert await bot_replies(runtime) == ["reply 1"]
    assert await undelivered(runtime) == 0


async def idle(consumer: InboxConsumer) -> bool:
    """Nothing waiting, held or dead in the consumer's inbox."""
    return not any((await consumer.inbox.depth()).values())
