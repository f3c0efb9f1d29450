"""A Mattermost channel's posts are answered in the channel's order, against the fake server
and the real stores: whatever an author's name lookup takes, whichever post's intake fails
once, and when a post that came while the socket was down is read by the catch-up after a
later one arrived live."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.config import Settings
from gateway.inbox.queue import Inbox
from gateway.stores.runtime import Runtime, open_runtime
from tests.conftest import ServerSet, make_settings
from tests.fakes.mattermost import FakeMattermost
from tests.helpers import wait_until
from tests.inbound.mattermost.helpers import mattermost_settings, running


@pytest.fixture
def settings(servers: ServerSet, fake_mattermost: FakeMattermost) -> Settings:
    return mattermost_settings(make_settings(servers), fake_mattermost.url)


async def test_two_new_authors_posting_in_turn_are_answered_in_turn(
        runtime: Runtime, fake_mattermost: FakeMattermost) -> None:
    """Neither author's name is known yet: Bob's lookup is slow, Carol's is not; Bob posted
    first, so Bob is answered first."""
    fake = fake_mattermost
    bob, carol = fake.add_user("u-bob", "bob"), fake.add_user("u-carol", "carol")
    async with running(runtime):
        await fake.wait_for_sockets(1)
        fake.slow("get_user", 0.5)  # the first lookup, Bob's
        await fake.create_post("general", "first, from bob", user_id=bob["id"])
        await fake.create_post("general", "second, from carol", user_id=carol["id"])
        await fake.wait_for_replies(2, timeout=10)
    assert fake.reply_messages() == ["echo: first, from bob", "echo: second, from carol"]


async def test_a_post_refused_once_is_taken_in_before_the_next(
        runtime: Runtime, fake_mattermost: FakeMattermost,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-durable refuses the first post's intake once: it is retried before the post
    behind it, not after."""
    fake = fake_mattermost
    real_push, refused = Inbox.push, []

    async def push_refused_once(self: Inbox, chat: str, entry: Any, key: Any,
                                ttl: int) -> Any:
        if not refused:
            refused.append(entry.incoming.text)
            raise RedisConnectionError("redis-durable went away for a moment")
        return await real_push(self, chat, entry, key, ttl)

    async with running(runtime):
        await fake.wait_for_sockets(1)
        monkeypatch.setattr(Inbox, "push", push_refused_once)
        await fake.create_post("general", "one")
        await fake.create_post("general", "two")
        await fake.wait_for_replies(2, timeout=10)
    assert refused == ["one"]
    assert fake.reply_messages() == ["echo: one", "echo: two"]


async def test_a_post_missed_while_away_is_answered_before_a_later_live_one(
        runtime: Runtime, fake_mattermost: FakeMattermost) -> None:
    """The socket drops, a post is made meanwhile; after the reconnect a new post arrives
    live while the catch-up still reads the channel: the missed one is answered first."""
    fake = fake_mattermost
    async with running(runtime) as listener:
        await fake.wait_for_sockets(1)
        await fake.drop_sockets(1000)
        await wait_until(lambda: not listener.state.connected, message="the drop seen")
        fake.make_post("general", "while away")  # stored, never pushed
        fake.slow("channel_posts", 1.0, count=2)  # the catch-up's reads of both channels
        await wait_until(lambda: fake.calls_to("channel_posts"), timeout=10,
                         message="the catch-up reads the channels")
        await fake.create_post("general", "after the reconnect")
        await fake.wait_for_replies(2, timeout=10)
    assert fake.reply_messages() == ["echo: while away", "echo: after the reconnect"]


async def test_posts_past_a_full_lane_are_read_again_and_answered_in_order(
        runtime: Runtime, settings: Settings, fake_mattermost: FakeMattermost,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-durable refuses every intake for a while and a channel's lane holds 2 posts:
    the 3 posts after them are left out, then read again over REST once the lane drained,
    and all 5 are answered once, in order."""
    fake = fake_mattermost
    real_push, refusing, refused = Inbox.push, [True], []

    async def push_while_allowed(self: Inbox, chat: str, entry: Any, key: Any,
                                 ttl: int) -> Any:
        if refusing[0]:
            refused.append(entry.incoming.text)
            raise RedisConnectionError("redis-durable refuses for now")
        return await real_push(self, chat, entry, key, ttl)

    monkeypatch.setattr(Inbox, "push", push_while_allowed)
    narrow = mattermost_settings(settings, fake.url, max_queued=2)
    rt = await open_runtime(narrow)
    try:
        async with running(rt) as listener:
            await fake.wait_for_sockets(1)
            await wait_until(lambda: listener.state.connected, message="connected")
            for i in range(5):
                await fake.create_post("general", f"post {i}")
            await wait_until(lambda: len(refused) >= 3, message="refused, and retried")
            assert set(refused) == {"post 0"}  # the head, retried in place
            reads = len(fake.calls_to("channel_posts"))
            refusing[0] = False
            await fake.wait_for_replies(5, timeout=10)
            assert len(fake.calls_to("channel_posts")) > reads  # the left-out posts re-read
    finally:
        await rt.close()
    assert fake.reply_messages() == [f"echo: post {i}" for i in range(5)]
