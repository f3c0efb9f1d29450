"""The inbox over several hash tags (``GATEWAY_INBOX_SHARDS``): a chat's keys all in the
shard its id hashes to, every shard served, each chat's entries still in order, and what
one shard (today's ``{inbox}`` keys) holds served once there are more."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from gateway import keys
from gateway.config import ConfigError, load_settings
from gateway.inbox.entry import Entry
from gateway.inbox.queue import Inbox, Pushed
from gateway.stores.runtime import Runtime
from tests.helpers import registry_violations
from tests.inbox.test_queue import entry

CHATS, PER_CHAT = 24, 4


async def drain(box: Inbox, holders: int) -> dict[str, list[int]]:
    """Take and ack everything with ``holders`` interleaved takers; each chat's message
    numbers in the order they were processed."""
    seen: dict[str, list[int]] = {}
    held: dict[str, tuple[str, str]] = {}  # chat -> (token, head)
    for turn in range(1000):
        token = f"t{turn % holders}-{turn}"
        for taken in await box.take(token, 3):
            assert taken.chat not in held  # one holder per chat
            held[taken.chat] = (token, taken.head)
        if not held:
            break
        chat, (token, head) = next(iter(held.items()))
        seen.setdefault(chat, []).append(int(Entry.decode(head).incoming.message_id))
        following = await box.ack(chat, token, head)
        if isinstance(following, str):
            held[chat] = (token, following)
        else:
            del held[chat]
    return seen


async def masters(runtime: Runtime, box: Inbox) -> set[str]:
    """The nodes holding the shards' keys (on a single instance: one)."""
    durable = runtime.durable
    if not isinstance(durable, RedisCluster):
        return {"single"}
    return {durable.nodes_manager.get_node_from_slot(key_slot(shard.ready.encode())).name
            for shard in box.shards}


async def test_sharded_chats_keep_their_order_on_every_shard(runtime: Runtime) -> None:
    box = Inbox(runtime.durable, "telegram", shards=3)
    assert len({shard.ready for shard in box.shards}) == 3
    assert box.shards[0].ready == keys.inbox("telegram", "ready")  # shard 0: today's keys
    for n in range(PER_CHAT):
        for chat in range(CHATS):
            assert await box.push(str(chat), entry(str(chat), n), None, 60) is Pushed.ACCEPTED
    used = {keys.shard_index(str(chat), 3) for chat in range(CHATS)}
    assert used == {0, 1, 2}
    for chat in range(CHATS):  # every key of a chat in its shard
        assert await runtime.durable.llen(box.chat_list(str(chat))) == PER_CHAT
    if isinstance(runtime.durable, RedisCluster):
        assert len(await masters(runtime, box)) == 3  # the local cluster's three masters
    seen = await drain(box, holders=2)
    assert seen == {str(chat): list(range(PER_CHAT)) for chat in range(CHATS)}
    assert await box.depth() == {"ready_chats": 0, "leased_chats": 0, "dead": 0}
    assert await registry_violations(runtime.durable, "durable") == []


async def test_every_shard_gets_a_turn(runtime: Runtime) -> None:
    """A take of one chat starts at the next shard each time: with every shard holding
    chats, three takes of one chat each take from three shards."""
    box = Inbox(runtime.durable, "telegram", shards=3)
    chats = {index: [str(c) for c in range(60) if keys.shard_index(str(c), 3) == index]
             for index in range(3)}
    for index in range(3):
        for chat in chats[index][:3]:
            await box.push(chat, entry(chat, 1), None, 60)
    taken = [(await box.take(f"t{n}", 1))[0].chat for n in range(3)]
    assert {keys.shard_index(chat, 3) for chat in taken} == {0, 1, 2}


async def test_one_shards_entries_are_served_after_sharding(runtime: Runtime) -> None:
    """Entries pushed under one tag (today's layout) are taken, renewed, reclaimed and
    acknowledged by an inbox of three shards: shard 0 is that tag."""
    before = Inbox(runtime.durable, "telegram")
    for n in range(2):
        for chat in ("a", "b", "c", "d"):
            await before.push(chat, entry(chat, n), None, 60)
    after = Inbox(runtime.durable, "telegram", shards=3)
    taken = await after.take("t", 10)
    assert sorted(t.chat for t in taken) == ["a", "b", "c", "d"]
    assert await after.renew({t.chat: "t" for t in taken}) == set()
    for item in taken:
        following = await after.ack(item.chat, "t", item.head)
        assert isinstance(following, str) and Entry.decode(following).incoming.message_id == "1"
        # A chat that does not hash to shard 0 is acknowledged where it was taken.
        assert await after.ack(item.chat, "t", following) is None
    assert await after.depth() == {"ready_chats": 0, "leased_chats": 0, "dead": 0}


def test_the_shard_count_is_a_bounded_setting() -> None:
    assert load_settings({}).inbox_shards == 1
    assert load_settings({"GATEWAY_INBOX_SHARDS": "3"}).inbox_shards == 3
    for wrong in ("0", "65", "two"):
        with pytest.raises(ConfigError, match="GATEWAY_INBOX_SHARDS"):
            load_settings({"GATEWAY_INBOX_SHARDS": wrong})


def test_shard_tags_are_evenly_spaced_over_the_slots() -> None:
    """Shard i's slot lies near shard 0's + i/N of the slot space: with N = 3 one shard in
    each third, whatever master layout of equal contiguous ranges."""
    for tag in (keys.INBOX_TAG, keys.PIPELINE_TAG):
        tags = keys.shard_tags(tag, 3)
        assert tags[0] == tag and len(set(tags)) == 3
        start = key_slot(tag.encode())
        offsets = [(key_slot(t.encode()) - start) % 16384 for t in tags]
        for index, offset in enumerate(offsets):
            assert abs(offset - index * 16384 // 3) < 64, (tag, offsets)
