"""handle_incoming against real PostgreSQL and Redis: conversations, feed rows, /new,
cache loss, redelivery, ordering across replicas, failing handlers and sends."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from gateway import keys
from gateway.config import Settings
from gateway.conversations import store
from gateway.conversations.handlers import Context
from gateway.conversations.service import (
    APOLOGY,
    ConversationService,
    Incoming,
    handle_incoming,
)
from gateway.outbound.errors import RetryLater, StoreOutage
from gateway.push import feed
from gateway.stores.embedded import RedisServer
from gateway.stores.postgres import create_pool
from gateway.stores.runtime import Runtime, open_runtime
from tests.helpers import registry_violations, wait_until

_ids = itertools.count(1)


def msg(text: str, chat: str = "777", **changes: Any) -> Incoming:
    fields: dict[str, Any] = dict(platform="telegram", chat=chat, thread=None, user_id="42",
                                  user_name="alice", text=text, message_id=str(next(_ids)))
    fields.update(changes)
    return Incoming(**fields)


class Outbox:
    """A send function that records what it was given (the platform's view)."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    async def __call__(self, text: str) -> None:
        self.texts.append(text)


async def rows(rt: Runtime, sql: str, *args: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in await rt.pg.fetch(sql, *args)]


async def test_text_postgresql_cannot_hold_is_stored_with_replacement_characters(
        fast_runtime: Runtime) -> None:
    """A NUL or a lone surrogate (both reach us in JSON from the platforms) must not make an
    acknowledged message unstorable: it is stored and answered, those characters replaced."""
    out = Outbox()
    await handle_incoming(fast_runtime, msg("pin\x00 1234 \ud800!", user_name="al\x00ice"),
                          out)
    assert out.texts == ["echo: pin\ufffd 1234 \ufffd! (1 messages)"]
    stored = await rows(fast_runtime, "SELECT role, text, user_name FROM conversation_messages"
                        " ORDER BY seq")
    assert stored[0] == {"role": "user", "text": "pin\ufffd 1234 \ufffd!",
                         "user_name": "al\ufffdice"}


async def test_message_is_stored_fed_and_answered(fast_runtime: Runtime) -> None:
    out = Outbox()
    await handle_incoming(fast_runtime, msg("hello"), out)
    await handle_incoming(fast_runtime, msg("again"), out)
    assert out.texts == ["echo: hello (1 messages)", "echo: again (3 messages)"]
    convs = await rows(fast_runtime, "SELECT id, message_count, active FROM conversations")
    assert convs == [{"id": convs[0]["id"], "message_count": 4, "active": True}]
    messages = await rows(fast_runtime, "SELECT seq, role, text, settled_at IS NOT NULL AS s"
                          " FROM conversation_messages ORDER BY seq")
    assert [(m["seq"], m["role"], m["s"]) for m in messages] == [
        (1, "user", False), (2, "bot", True), (3, "user", False), (4, "bot", True)]
    _, feed_rows = await feed.read(fast_runtime.pg, f"conversation:{convs[0]['id']}", 0, 10)
    assert [r.offset for r in feed_rows] == [1, 2, 3, 4]
    assert [r.payload["text"] for r in feed_rows] == [
        "hello", "echo: hello (1 messages)", "again", "echo: again (3 messages)"]
    pointer = keys.telegram_active_conv("777")
    assert await fast_runtime.cache.get(pointer) == str(convs[0]["id"])
    assert 0 < await fast_runtime.cache.ttl(pointer) <= 7 * 86400
    assert await registry_violations(fast_runtime.cache, "cache") == []
    assert await registry_violations(fast_runtime.durable, "durable") == []


async def test_new_switches_conversation_and_help_status(fast_runtime: Runtime) -> None:
    out = Outbox()
    await handle_incoming(fast_runtime, msg("first"), out)
    first = int(await fast_runtime.cache.get(keys.telegram_active_conv("777")))
    await handle_incoming(fast_runtime, msg("/new@fake_gateway_bot"), out)
    second = int(await fast_runtime.cache.get(keys.telegram_active_conv("777")))
    await handle_incoming(fast_runtime, msg("/status"), out)
    await handle_incoming(fast_runtime, msg("/help"), out)
    assert second != first
    assert out.texts[1] == f"Started a new conversation (#{second})."
    assert out.texts[2] == f"Conversation #{second}: 3 messages."
    assert out.texts[3].startswith("Commands: /new")
    convs = await rows(fast_runtime, "SELECT id, active, message_count FROM conversations"
                       " ORDER BY id")
    assert convs == [{"id": first, "active": False, "message_count": 2},
                     {"id": second, "active": True, "message_count": 6}]


async def test_flushing_the_cache_keeps_the_conversation(fast_runtime: Runtime) -> None:
    out = Outbox()
    await handle_incoming(fast_runtime, msg("one"), out)
    pointer = keys.telegram_active_conv("777")
    await fast_runtime.cache.expire(pointer, 5)
    await handle_incoming(fast_runtime, msg("sliding"), out)
    assert await fast_runtime.cache.ttl(pointer) > 5  # every message renews the idle TTL
    await fast_runtime.cache.flushall()
    await handle_incoming(fast_runtime, msg("two"), out)
    assert out.texts[-1] == "echo: two (5 messages)"  # same conversation, not a new one
    assert await fast_runtime.pg.fetchval("SELECT count(*) FROM conversations") == 1
    assert await fast_runtime.cache.get(keys.telegram_active_conv("777")) is not None


async def test_a_stale_pointer_is_ignored(fast_runtime: Runtime) -> None:
    out = Outbox()
    await handle_incoming(fast_runtime, msg("one"), out)
    await fast_runtime.cache.set(keys.telegram_active_conv("777"), "999999", ex=60)
    await handle_incoming(fast_runtime, msg("two"), out)
    assert out.texts[-1] == "echo: two (3 messages)"


async def test_redelivered_message_is_answered_once(fast_runtime: Runtime) -> None:
    out = Outbox()
    same = msg("hi")
    await asyncio.gather(*(handle_incoming(fast_runtime, same, out) for _ in range(3)))
    await handle_incoming(fast_runtime, same, out)
    assert out.texts == ["echo: hi (1 messages)"]
    assert await fast_runtime.pg.fetchval("SELECT count(*) FROM conversation_messages") == 2


async def test_unsettled_reply_is_sent_on_redelivery(fast_runtime: Runtime) -> None:
    """The process died after storing the reply and before sending it: the platform's retry
    gets the stored reply, not a second answer."""
    out = Outbox()
    same = msg("hi")
    await handle_incoming(fast_runtime, same, out)
    await fast_runtime.pg.execute("UPDATE conversation_messages SET settled_at = NULL")
    await handle_incoming(fast_runtime, same, out)
    assert out.texts == ["echo: hi (1 messages)"] * 2
    assert await fast_runtime.pg.fetchval("SELECT count(*) FROM conversation_messages") == 2


async def test_stored_but_unanswered_message_is_answered_on_redelivery(
        fast_runtime: Runtime) -> None:
    """The process died after storing the message, before the handler ran: the platform's
    retry gets the answer (once), without storing the message twice."""
    out = Outbox()
    same = msg("hi")
    await handle_incoming(fast_runtime, same, out)
    await fast_runtime.pg.execute("DELETE FROM conversation_messages WHERE role = 'bot'")
    await handle_incoming(fast_runtime, same, out)
    await handle_incoming(fast_runtime, same, out)
    assert len(out.texts) == 2 and out.texts[0] == "echo: hi (1 messages)"
    roles = [r["role"] for r in await fast_runtime.pg.fetch(
        "SELECT role FROM conversation_messages ORDER BY seq")]
    assert roles == ["user", "bot"]


async def test_chats_and_threads_are_separate(fast_runtime: Runtime) -> None:
    out = Outbox()
    await handle_incoming(fast_runtime, msg("a", chat="1"), out)
    await handle_incoming(fast_runtime, msg("b", chat="2"), out)
    slack = dict(platform="slack", team="T1", chat="C1")
    await handle_incoming(fast_runtime, msg("c", **slack), out)
    await handle_incoming(fast_runtime, msg("d", thread="171.5", **slack), out)
    assert out.texts == [f"echo: {t} (1 messages)" for t in "abcd"]
    assert await fast_runtime.cache.exists(keys.slack_active_conv("T1", "C1", "171.5"))
    assert await fast_runtime.cache.exists(keys.slack_active_conv("T1", "C1"))


async def test_replicas_take_turns_on_one_chat(fast_settings: Settings,
                                               fast_runtime: Runtime) -> None:
    """Two services on separate connections (two replicas) handle one chat at once: every
    reply directly follows its message, none interleave."""
    other = await open_runtime(fast_settings)
    try:
        replicas = [ConversationService(fast_runtime), ConversationService(other)]

        async def slow_echo(ctx: Context) -> str:
            await asyncio.sleep(0.005)  # widen the window an interleaving would need
            return f"re {ctx.incoming.text}"

        for replica in replicas:
            replica.handler = slow_echo
        out = Outbox()
        await asyncio.gather(*(replicas[i % 2].handle(msg(f"m{i}"), out) for i in range(30)))
    finally:
        await other.close()
    messages = await rows(fast_runtime, "SELECT seq, role, text, reply_to"
                          " FROM conversation_messages ORDER BY seq")
    assert len(messages) == 60
    for user, bot in zip(messages[::2], messages[1::2], strict=True):
        assert (user["role"], bot["role"]) == ("user", "bot")
        assert bot["reply_to"] == user["seq"] and bot["text"] == "re " + user["text"]
    assert out.texts == [m["text"] for m in messages[1::2]]  # sent in stored order


async def test_a_chat_busy_for_longer_than_the_command_timeout_is_waited_for(
        fast_settings: Settings, fast_runtime: Runtime, monkeypatch: Any) -> None:
    """Another replica holds the chat (a slow reply) for longer than this pool's command
    timeout: the message waits its turn and is answered, it is not dropped."""
    monkeypatch.setattr(store, "LOCK_SLICE_SECONDS", 0.2, raising=False)
    assert fast_settings.database_url
    short = await create_pool(fast_settings.database_url, max_size=4, command_timeout=0.5)
    replica = dataclasses.replace(fast_runtime, pg=short)
    incoming, out = msg("waited"), Outbox()
    try:
        async with fast_runtime.pg.acquire() as other:  # the other replica, mid-reply
            await store.lock_chat(other, incoming)
            waiting = asyncio.create_task(ConversationService(replica).handle(incoming, out))
            await wait_until(lambda: _waits_on_advisory_lock(fast_runtime), timeout=5)
            done, _ = await asyncio.wait([waiting], timeout=1.5)  # three command timeouts
            assert not done, "the waiting message gave up"
            await store.unlock_chat(other, incoming)
        await asyncio.wait_for(waiting, 10)
        assert out.texts == ["echo: waited (1 messages)"]
    finally:
        await short.close()


async def _waits_on_advisory_lock(rt: Runtime) -> bool:
    return bool(await rt.pg.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"))


async def test_one_process_keeps_arrival_order(fast_runtime: Runtime) -> None:
    out = Outbox()
    tasks = [asyncio.create_task(handle_incoming(fast_runtime, msg(f"n{i}"), out))
             for i in range(40)]
    await asyncio.gather(*tasks)
    assert [t.split()[1] for t in out.texts] == [f"n{i}" for i in range(40)]


async def test_failing_handler_answers_with_an_apology(fast_runtime: Runtime) -> None:
    async def broken(ctx: Context) -> str:
        raise RuntimeError("model down")

    service = ConversationService(fast_runtime, handler=broken)
    out = Outbox()
    await service.handle(msg("hi"), out)
    assert out.texts == [APOLOGY]


async def test_platform_429_is_retried_after_retry_after(fast_runtime: Runtime) -> None:
    calls: list[float] = []
    loop = asyncio.get_running_loop()

    async def limited_once(text: str) -> None:
        calls.append(loop.time())
        if len(calls) == 1:
            raise RetryLater(0.2)

    outcome = await ConversationService(fast_runtime).handle(msg("x"), limited_once)
    assert outcome.delivered and len(calls) == 2
    assert calls[1] - calls[0] >= 0.19
    assert await fast_runtime.pg.fetchval("SELECT count(*) FROM undelivered_replies") == 0


async def test_failed_send_is_retried_then_dead_lettered(fast_runtime: Runtime) -> None:
    attempts = 0

    async def broken(text: str) -> None:
        nonlocal attempts
        attempts += 1
        raise ConnectionError("platform unreachable")

    outcome = await ConversationService(fast_runtime).handle(msg("lost?"), broken)
    assert not outcome.delivered
    assert attempts == 3  # [outbound] attempts = 3 in these tests
    dead = await rows(fast_runtime, "SELECT platform, chat, text, attempts, last_error,"
                      " conversation_id, message_seq FROM undelivered_replies")
    assert dead == [{"platform": "telegram", "chat": "777", "text": "echo: lost? (1 messages)",
                     "attempts": 3, "last_error": "ConnectionError: platform unreachable",
                     "conversation_id": outcome.conversation_id, "message_seq": 2}]




async def test_unreachable_limiter_store_is_an_outage_and_the_retry_sends_the_reply(
        fast_settings: Settings, runtime: Runtime,
        redis_factory: Callable[..., RedisServer]) -> None:
    """redis-durable dies between messages: the reply cannot pass the limiter. That is no
    send failure (nothing retried against the dead store, nothing dead-lettered): the caller
    gets ``StoreOutage``, and the platform's retry after the restart sends the stored reply."""
    durable = redis_factory("durable")
    rt = await open_runtime(dataclasses.replace(fast_settings, durable_url=durable.url))
    out = Outbox()
    during = msg("during")
    try:
        service = ConversationService(rt)
        await service.handle(msg("before"), out)
        durable.kill()
        with pytest.raises(StoreOutage):
            await service.handle(during, out)
        durable.restart()
        retried = await service.handle(during, out)
        await service.handle(msg("after"), out)
    finally:
        await rt.close()
    assert retried.duplicate and retried.delivered
    assert out.texts == ["echo: before (1 messages)", "echo: during (3 messages)",
                         "echo: after (5 messages)"]
    assert await runtime.pg.fetchval("SELECT count(*) FROM undelivered_replies") == 0


async def test_more_chats_than_pool_connections(fast_settings: Settings,
                                                fast_runtime: Runtime) -> None:
    """Each chat in flight holds one pooled connection for its lock; nothing inside may ask
    the pool for a second one, or a full pool would wait on itself forever."""
    rt = await open_runtime(fast_settings, pg_max_size=3)
    try:
        out = Outbox()
        await asyncio.wait_for(asyncio.gather(*(
            handle_incoming(rt, msg(f"c{i}", chat=str(1000 + i)), out) for i in range(12))), 30)
    finally:
        await rt.close()
    assert sorted(out.texts) == sorted(f"echo: c{i} (1 messages)" for i in range(12))


async def test_chats_waiting_on_retry_after_leave_connections_for_others(
        fast_settings: Settings, fast_runtime: Runtime) -> None:
    rt = await open_runtime(fast_settings, pg_max_size=4)
    limited: set[str] = set()

    async def slow_platform(text: str) -> None:
        if text not in limited:
            limited.add(text)
            raise RetryLater(1.0)

    try:
        chats = [asyncio.create_task(handle_incoming(rt, msg(f"w{i}", chat=str(2000 + i)),
                                                     slow_platform)) for i in range(6)]
        await wait_until(lambda: len(limited) >= 2, message="chats waiting on Retry-After")
        # Two chats sit on their connections; the process still reaches PostgreSQL at once.
        assert await asyncio.wait_for(rt.pg.fetchval("SELECT 1"), 0.5) == 1
        await asyncio.wait_for(asyncio.gather(*chats), 30)
    finally:
        await rt.close()
    assert len(limited) == 6
