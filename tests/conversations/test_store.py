"""store.receive / store.reply (the PL/pgSQL functions of 0005_conversation_functions.sql)
against real PostgreSQL: one conversation per chat under concurrency, redelivery, /new, one
reply per message, and feed rows equal to what was stored."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from gateway.conversations import store
from gateway.conversations.model import Incoming
from gateway.push import feed
from gateway.stores.runtime import Runtime
from tests.helpers import wait_until

_ids = itertools.count(1)


def msg(text: str, chat: str = "900", **changes: Any) -> Incoming:
    fields: dict[str, Any] = dict(platform="telegram", chat=chat, thread=None, user_id="7",
                                  user_name="bob", text=text, message_id=f"m{next(_ids)}")
    fields.update(changes)
    return Incoming(**fields)


async def rows(rt: Runtime, sql: str, *args: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in await rt.pg.fetch(sql, *args)]


async def _waits_on_a_lock(rt: Runtime) -> bool:
    return bool(await rt.pg.fetchval("SELECT count(*) FROM pg_locks WHERE NOT granted"))


async def test_concurrent_first_messages_create_one_conversation(runtime: Runtime) -> None:
    """The second first message waits for the first one's insert to commit, then uses that
    conversation instead of creating another (conversations_one_active)."""
    first, second = msg("a"), msg("b")
    async with runtime.pg.acquire() as one, runtime.pg.acquire() as two:
        tx = one.transaction()
        await tx.start()
        got_one = await store.receive(one, first, None, is_new=False)
        racing = asyncio.create_task(store.receive(two, second, None, is_new=False))
        await wait_until(lambda: _waits_on_a_lock(runtime), timeout=5)
        assert not racing.done()
        await tx.commit()
        got_two = await asyncio.wait_for(racing, 5)
    assert (got_one.created, got_one.seq) == (True, 1)
    assert (got_two.created, got_two.seq) == (False, 2)
    assert got_two.conversation_id == got_one.conversation_id
    assert await rows(runtime, "SELECT id, active, message_count FROM conversations") == [
        {"id": got_one.conversation_id, "active": True, "message_count": 2}]


async def test_many_first_messages_at_once_share_one_conversation(runtime: Runtime) -> None:
    async def one(i: int) -> store.Received:
        async with runtime.pg.acquire() as conn:
            return await store.receive(conn, msg(f"n{i}"), None, is_new=False)

    got = await asyncio.gather(*(one(i) for i in range(8)))
    assert len({g.conversation_id for g in got}) == 1
    assert sum(g.created for g in got) == 1
    assert sorted(g.seq for g in got) == list(range(1, 9))
    assert await runtime.pg.fetchval("SELECT count(*) FROM conversations") == 1
    assert await runtime.pg.fetchval("SELECT count(*) FROM conversation_messages") == 8


async def test_redelivered_message_id_is_a_duplicate_with_the_stored_seq(
        runtime: Runtime) -> None:
    before, same = msg("before"), msg("hi")
    async with runtime.pg.acquire() as conn:
        await store.receive(conn, before, None, is_new=False)
        stored = await store.receive(conn, same, None, is_new=False)
        again = await store.receive(conn, same, stored.conversation_id, is_new=False)
        assert (again.duplicate, again.seq, again.row) == (True, 2, None)
        assert (again.reply_seq, again.reply_text, again.reply_settled) == (None, None, False)
        await store.reply(conn, same, stored.conversation_id, stored.seq, "hello")
        answered = await store.receive(conn, same, None, is_new=False)
        assert (answered.duplicate, answered.seq) == (True, 2)
        assert (answered.reply_seq, answered.reply_text, answered.reply_settled) == (
            3, "hello", False)
        await store.settle(conn, stored.conversation_id, 3)
        settled = await store.receive(conn, same, None, is_new=True)  # /new text or not
        assert (settled.duplicate, settled.reply_settled) == (True, True)
    assert not stored.duplicate and stored.row is not None
    assert await rows(runtime, "SELECT seq, role, platform_message_id, reply_to"
                      " FROM conversation_messages ORDER BY seq") == [
        {"seq": 1, "role": "user", "platform_message_id": before.message_id,
         "reply_to": None},
        {"seq": 2, "role": "user", "platform_message_id": same.message_id, "reply_to": None},
        {"seq": 3, "role": "bot", "platform_message_id": None, "reply_to": 2}]
    assert await rows(runtime, "SELECT message_count, active FROM conversations") == [
        {"message_count": 3, "active": True}]
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed") == 3


async def test_new_ends_the_active_conversation_and_starts_one(runtime: Runtime) -> None:
    async with runtime.pg.acquire() as conn:
        opened = await store.receive(conn, msg("/new"), None, is_new=True)  # first contact
        await store.receive(conn, msg("hi"), opened.conversation_id, is_new=False)
        renewed = await store.receive(conn, msg("/new@bot"), opened.conversation_id,
                                      is_new=True)
    assert opened.created and renewed.created and not renewed.duplicate
    assert renewed.conversation_id != opened.conversation_id and renewed.seq == 1
    assert await rows(runtime, "SELECT id, active, ended_at IS NOT NULL AS ended,"
                      " message_count FROM conversations ORDER BY id") == [
        {"id": opened.conversation_id, "active": False, "ended": True, "message_count": 2},
        {"id": renewed.conversation_id, "active": True, "ended": False, "message_count": 1}]
    assert await rows(runtime, "SELECT conversation_id, seq, text FROM conversation_messages"
                      " WHERE conversation_id = $1", renewed.conversation_id) == [
        {"conversation_id": renewed.conversation_id, "seq": 1, "text": "/new@bot"}]


async def test_a_stale_or_foreign_pointer_is_not_used(runtime: Runtime) -> None:
    async with runtime.pg.acquire() as conn:
        other = await store.receive(conn, msg("x", chat="901"), None, is_new=False)
        mine = await store.receive(conn, msg("y"), other.conversation_id, is_new=False)
        stale = await store.receive(conn, msg("z"), 999_999, is_new=False)
    assert mine.created and mine.conversation_id != other.conversation_id
    assert (stale.created, stale.conversation_id, stale.seq) == (
        False, mine.conversation_id, 2)


async def test_a_second_reply_to_one_seq_returns_the_first(runtime: Runtime) -> None:
    incoming = msg("q")
    async with runtime.pg.acquire() as conn:
        received = await store.receive(conn, incoming, None, is_new=False)
        first = await store.reply(conn, incoming, received.conversation_id, 1, "answer")
        second = await store.reply(conn, incoming, received.conversation_id, 1, "another")
    assert first.row is not None and (first.seq, first.text) == (2, "answer")
    assert (second.seq, second.text, second.row) == (2, "answer", None)
    assert await rows(runtime, "SELECT seq, role, text, reply_to FROM conversation_messages"
                      " ORDER BY seq") == [
        {"seq": 1, "role": "user", "text": "q", "reply_to": None},
        {"seq": 2, "role": "bot", "text": "answer", "reply_to": 1}]
    assert await runtime.pg.fetchval("SELECT message_count FROM conversations") == 2
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed") == 2


async def test_the_returned_feed_rows_are_the_stored_ones(runtime: Runtime) -> None:
    """The service signals the rows it was handed without reading them back: they must be
    what a feed reader gets, payload included."""
    incoming = msg("pay\ufffdload", platform="slack", team="T9", chat="C9", thread="17.5",
                   user_name=None)
    async with runtime.pg.acquire() as conn:
        received = await store.receive(conn, incoming, None, is_new=False)
        replied = await store.reply(conn, incoming, received.conversation_id, received.seq,
                                    "ok")
    assert received.row is not None and replied.row is not None
    conversation_id = received.conversation_id
    _, stored = await feed.read(runtime.pg, store.topic(conversation_id), 0, 10)
    assert stored == [received.row, replied.row]
    assert received.row.payload == {
        "conversation_id": conversation_id, "seq": 1, "role": "user",
        "text": "pay\ufffdload", "platform": "slack", "chat": "C9", "thread": "17.5",
        "user_id": "7", "user_name": None}
    assert replied.row.payload == {
        "conversation_id": conversation_id, "seq": 2, "role": "bot", "text": "ok",
        "platform": "slack", "chat": "C9", "thread": "17.5", "user_id": None,
        "user_name": None}
    assert await runtime.pg.fetchval("SELECT team FROM conversations") == "T9"


_COMMIT_PROBE = """
CREATE TABLE settle_probe (synchronous_commit text);
CREATE FUNCTION settle_probe() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO settle_probe VALUES (current_setting('synchronous_commit'));
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER settle_probe AFTER UPDATE ON conversation_messages
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION settle_probe();
"""


async def test_the_settle_alone_commits_without_waiting_for_its_flush(
        runtime: Runtime) -> None:
    """The settle's transaction commits with ``synchronous_commit = off`` (a deferred
    trigger sees the setting at COMMIT), and only it: the session keeps its setting (so the
    leased path may skip the pool's reset after it), no transaction is left open, and inside
    a caller's transaction the caller's commit decides."""
    async with runtime.pg.acquire() as conn:
        await conn.execute(_COMMIT_PROBE)
        try:
            replies = []
            for text in ("a", "b", "c"):
                got = await store.receive(conn, msg(text), None, is_new=False)
                replies.append(await store.reply(conn, msg(text), got.conversation_id,
                                                 got.seq, "ok"))
            cid = got.conversation_id
            await store.settle(conn, cid, replies[0].seq)
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
            await store.settle(conn, cid, replies[1].seq)
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
            assert not conn.is_in_transaction()
            async with conn.transaction():
                await store.settle(conn, cid, replies[2].seq)
            probed = await conn.fetch("SELECT synchronous_commit FROM settle_probe")
            settled = await conn.fetchval(
                "SELECT count(*) FROM conversation_messages WHERE settled_at IS NOT NULL")
        finally:
            await conn.execute("DROP TRIGGER settle_probe ON conversation_messages;"
                               " DROP FUNCTION settle_probe(); DROP TABLE settle_probe")
    assert [r[0] for r in probed] == ["off", "off", "on"] and settled == 3
