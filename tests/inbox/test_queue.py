"""The inbox scripts on a real redis-durable: order per chat, one holder per chat, ack,
release, reclaim, dead letters, the claim taken with the entry."""

from __future__ import annotations

import asyncio

import pytest

from gateway import keys
from gateway.conversations.model import Incoming
from gateway.inbox.entry import BadEntry, Entry
from gateway.inbox.queue import Inbox, InboxLimits, Lost, Pushed
from gateway.stores.runtime import Runtime
from tests.helpers import registry_violations, wait_until


def entry(chat: str, n: int) -> Entry:
    return Entry(Incoming(platform="telegram", chat=chat, thread=None, user_id="u",
                          user_name="user", text=f"message {n}", message_id=str(n)),
                 {"chat_id": chat})


def inbox(runtime: Runtime, **limits: float) -> Inbox:
    return Inbox(runtime.durable, "telegram", InboxLimits(**limits))  # type: ignore[arg-type]


async def test_push_claims_and_keeps_order(runtime: Runtime) -> None:
    box = inbox(runtime)
    claim = keys.dedup_telegram_update(1, 10)
    assert await box.push("7", entry("7", 1), claim, 60) is Pushed.ACCEPTED
    assert await box.push("7", entry("7", 1), claim, 60) is Pushed.DUPLICATE
    assert await box.push("7", entry("7", 2), None, 60) is Pushed.ACCEPTED
    assert await runtime.durable.get(claim) == "done"
    assert 0 < await runtime.durable.ttl(claim) <= 60
    [taken] = await box.take("t1", 10)
    assert taken.chat == "7" and Entry.decode(taken.head) == entry("7", 1)
    following = await box.ack("7", "t1", taken.head)
    assert isinstance(following, str) and Entry.decode(following) == entry("7", 2)
    assert await box.ack("7", "t1", following) is None
    assert await box.depth() == {"ready_chats": 0, "leased_chats": 0, "dead": 0}
    assert await registry_violations(runtime.durable, "durable") == []


async def test_a_held_chat_is_not_taken_twice(runtime: Runtime) -> None:
    box = inbox(runtime)
    await box.push("a", entry("a", 1), None, 60)
    await box.push("b", entry("b", 1), None, 60)
    first = await box.take("t1", 1)
    second = await box.take("t2", 10)
    assert [t.chat for t in first] == ["a"] and [t.chat for t in second] == ["b"]
    await box.push("a", entry("a", 2), None, 60)  # arrives while "a" is held
    assert await box.take("t3", 10) == []
    following = await box.ack("a", "t1", first[0].head)
    assert isinstance(following, str) and Entry.decode(following).incoming.text == "message 2"


async def test_ack_by_a_stale_holder_is_refused(runtime: Runtime) -> None:
    box = inbox(runtime, lease_seconds=0.05)
    await box.push("a", entry("a", 1), None, 60)
    [taken] = await box.take("old", 1)
    await wait_until(lambda: box.reclaim(), timeout=5)
    [again] = await box.take("new", 1)
    assert again.head == taken.head
    assert await box.ack("a", "old", taken.head) is Lost.LEASE
    assert not (await box.before_send("a", "old"))[0]
    assert (await box.before_send("a", "new"))[0]
    assert await runtime.durable.llen(box.chat_list("a")) == 1  # still there for "new"


async def test_release_counts_failures_then_dead_letters(runtime: Runtime) -> None:
    box = inbox(runtime, max_failures=3)
    await box.push("a", entry("a", 1), None, 60)
    await box.push("a", entry("a", 2), None, 60)
    for attempt in range(3):
        [taken] = await box.take(f"t{attempt}", 1)
        assert Entry.decode(taken.head).incoming.text == "message 1"
        dead = await box.release("a", f"t{attempt}", delay=0, counted=True)
        assert dead is (attempt == 2)
    [taken] = await box.take("t9", 1)
    assert Entry.decode(taken.head).incoming.text == "message 2"  # the chat goes on
    assert (await box.depth())["dead"] == 1


async def test_release_not_counted_never_dead_letters(runtime: Runtime) -> None:
    box = inbox(runtime, max_failures=1)
    await box.push("a", entry("a", 1), None, 60)
    [taken] = await box.take("t", 1)
    # A delay long enough that a loaded CI machine takes again well before it ends.
    assert not await box.release("a", "t", delay=3, counted=False)
    assert await box.take("t2", 1) == []  # not before the delay
    taken_later = await wait_until(lambda: box.take("t2", 1), timeout=15)
    assert taken_later[0].head == taken.head


async def test_renew_keeps_a_lease_and_reports_lost_ones(runtime: Runtime) -> None:
    box = inbox(runtime, lease_seconds=0.3)
    await box.push("a", entry("a", 1), None, 60)
    await box.push("b", entry("b", 1), None, 60)
    taken = await box.take("t", 2)
    assert {t.chat for t in taken} == {"a", "b"}
    for _ in range(4):
        await asyncio.sleep(0.1)  # lets the lease age; renewal must keep it
        assert await box.renew({"a": "t"}) == set()
    assert await box.reclaim() == 1  # only "b" expired
    assert await box.renew({"a": "t", "b": "t"}) == {"b"}


async def test_full_chat_is_refused_without_a_claim(runtime: Runtime) -> None:
    box = inbox(runtime, max_per_chat=2)
    for n in range(2):
        assert await box.push("a", entry("a", n), None, 60) is Pushed.ACCEPTED
    claim = keys.dedup_telegram_update(1, 99)
    assert await box.push("a", entry("a", 9), claim, 60) is Pushed.FULL
    assert await runtime.durable.exists(claim) == 0  # the platform's retry gets through
    assert await box.push("b", entry("b", 1), None, 60) is Pushed.ACCEPTED


async def test_a_reclaim_counts_as_a_failure(runtime: Runtime) -> None:
    box = inbox(runtime, lease_seconds=0.05, max_failures=2)
    await box.push("a", entry("a", 1), None, 60)
    for holder in ("h1", "h2"):
        assert await box.take(holder, 1)
        await wait_until(lambda: box.reclaim(), timeout=5)
    assert await box.depth() == {"ready_chats": 0, "leased_chats": 0, "dead": 1}


async def test_a_head_given_back_uncounted_is_taken_as_a_retry(runtime: Runtime) -> None:
    """A store outage or a shutdown gives the chat back without counting a failure, but its
    holder may have sent part of the reply: the next take says the head was tried before,
    so an adapter that can look on the platform does. A head handed on by ACK counts as
    taken; a fresh one does not."""
    box = inbox(runtime)
    await box.push("a", entry("a", 1), None, 60)
    await box.push("a", entry("a", 2), None, 60)
    [first] = await box.take("t1", 1)
    assert first.attempts == 0  # fresh
    await box.release("a", "t1", delay=0, counted=False)
    [again] = await box.take("t2", 1)
    assert again.head == first.head and again.attempts == 1
    following = await box.ack("a", "t2", again.head)  # the holder goes on with message 2
    assert isinstance(following, str)
    await box.release("a", "t2", delay=0, counted=False)
    [second] = await box.take("t3", 1)
    assert second.head == following and second.attempts == 1
    assert await box.ack("a", "t3", second.head) is None
    await box.push("a", entry("a", 3), None, 60)
    [third] = await box.take("t4", 1)
    assert third.attempts == 0  # a new head after the chat was done


async def test_a_dead_lettered_head_leaves_no_sent_record(runtime: Runtime) -> None:
    """The fence's record of a head's reply goes with the head into the dead letters, by a
    release or by a reclaim: nothing is left in the ``sent`` hash (ACK is not coming)."""
    box = inbox(runtime, lease_seconds=0.05, max_failures=1)
    for chat, ends in (("a", "release"), ("b", "reclaim")):
        await box.push(chat, entry(chat, 1), None, 60)
        assert await box.take("t", 1)
        await box.mark_sent(chat, "a-digest 42")  # a reply was being shown
        if ends == "release":
            assert await box.release(chat, "t", delay=0, counted=True)
        else:
            await wait_until(lambda: box.reclaim(), timeout=5)
        assert await runtime.durable.hget(box.shard(chat).sent, chat) is None, ends
    assert (await box.depth())["dead"] == 2


def test_entries_round_trip_and_refuse_garbage() -> None:
    original = entry("5", 1)
    assert Entry.decode(original.encode()) == original
    for raw in ("{", "[]", '{"v": 2}', '{"v": 1, "incoming": {"platform": "x"}}'):
        with pytest.raises(BadEntry):
            Entry.decode(raw)
