"""Posts taken in per channel, in the channel's order.

One lane per channel: its posts (live from the socket, or read over REST by a catch-up) wait
in a queue, and one task takes them in one after the other, each once the one before it is
stored. So the inbox gets a channel's posts in order however long an author's name lookup
takes, and a post whose intake fails is retried in place, the posts behind it waiting:
store errors and refusals (a full chat) until they pass, any other fault ``attempts`` times
before the post is skipped (logged; a later catch-up reads it again). While a catch-up reads a
channel, that channel's live posts are held and queued after what it read, so a post that
came while the socket was down is not taken in after one that came later.

A lane queues at most ``max_queued`` posts; past that it queues none until it has drained,
then reads the channel again from the first post it left out (a "gap"; each read queues at
least that one, so it progresses): a stalled chat costs no memory beyond that and loses
nothing. Posts queued twice (a catch-up reads some
that were queued live) are harmless: the intake's claim takes each post once.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from gateway.api.errors import ApiError
from gateway.inbound.mattermost.backoff import Backoff
from gateway.inbound.mattermost.client import Post
from gateway.stores.redis import UNREACHABLE

log = logging.getLogger("gateway.mattermost")

# Takes one post in (claim + inbox); raises when it could not.
Intake = Callable[[Post], Awaitable[None]]
# A channel's posts since a time (ms), oldest first.
Fetch = Callable[[str, int], Awaitable[list[Post]]]
Spawn = Callable[[Coroutine[Any, Any, None]], None]

# Failures that pass with time (redis-durable out of reach or refusing, a full chat): the
# post is retried until it is taken in, the channel's later posts waiting behind it.
TRANSIENT = (RedisError, ApiError, *UNREACHABLE)


@dataclass(frozen=True)
class LanePolicy:
    max_queued: int = 1000
    attempts: int = 5  # any other fault: tries before the post is skipped
    backoff_initial: float = 0.5
    backoff_max: float = 30.0


class Lane:
    def __init__(self, lanes: Lanes, channel_id: str) -> None:
        self.lanes = lanes
        self.channel_id = channel_id
        self.queue: collections.deque[Post] = collections.deque()
        self.gap: int | None = None  # create_at of the first post left out
        self.held: list[Post] | None = None  # live posts held while the channel is read
        self.busy = False
        self.reading = asyncio.Lock()
        self.rereads = Backoff(lanes.policy.backoff_initial, lanes.policy.backoff_max)

    def add(self, post: Post) -> None:
        if self.held is not None:
            self.held.append(post)
        else:
            self._queue(post)

    def _queue(self, post: Post) -> None:
        if self.gap is not None or len(self.queue) >= self.lanes.policy.max_queued:
            self.gap = post.create_at if self.gap is None else min(self.gap, post.create_at)
            return
        self.queue.append(post)
        if not self.busy:
            self.busy = True
            self.lanes.spawn(self._work())

    async def read(self, since: int) -> None:
        """Queue the channel's posts created since ``since``, then the live posts that came
        meanwhile; raises (and queues the held posts) when the channel cannot be read."""
        async with self.reading:
            if self.held is None:
                self.held = []
            try:
                posts = await self.lanes.fetch(self.channel_id, since)
                # ``since`` also returns posts *edited* since: an old post whose claim has
                # expired would be answered a second time.
                for post in posts:
                    if post.create_at >= since:
                        self._queue(post)
            finally:
                self.release()

    def release(self) -> None:
        """Queue the held live posts; stop holding."""
        held, self.held = self.held or [], None
        for post in held:
            self._queue(post)

    async def _work(self) -> None:
        try:
            while self.queue or self.gap is not None:
                if self.queue:
                    await self._take_in(self.queue[0])
                    self.queue.popleft()
                else:
                    await self._read_gap()
        finally:
            self.busy = False

    async def _take_in(self, post: Post) -> None:
        policy = self.lanes.policy
        backoff = Backoff(policy.backoff_initial, policy.backoff_max)
        faults = 0
        while True:
            try:
                async with self.lanes.slots:
                    await self.lanes.intake(post)
                return
            except TRANSIENT as exc:
                log.warning("mattermost post %s: not taken in (%s); retrying", post.id, exc)
            except Exception:
                faults += 1
                if faults >= policy.attempts:
                    log.exception("mattermost post %s: intake failed %d times; skipped",
                                  post.id, faults)
                    return
                log.exception("mattermost post %s: intake failed; retrying", post.id)
            await asyncio.sleep(backoff.next())

    async def _read_gap(self) -> None:
        first, self.gap = self.gap, None
        assert first is not None
        try:
            # From the post itself (``since`` is exclusive): what came before it was queued.
            await self.read(first - 1)
        except Exception as exc:
            log.warning("mattermost channel %s: reading posts left out failed (%s); retrying",
                        self.channel_id, type(exc).__name__)
            self.gap = first if self.gap is None else min(self.gap, first)
            await asyncio.sleep(self.rereads.next())
        else:
            self.rereads.reset()


class Lanes:
    """The lanes of one listener session (its lease): ``add`` a live post, ``read`` a
    channel during a catch-up between ``hold`` and ``release``."""

    def __init__(self, intake: Intake, fetch: Fetch, spawn: Spawn, slots: asyncio.Semaphore,
                 policy: LanePolicy) -> None:
        self.intake, self.fetch, self.spawn, self.slots = intake, fetch, spawn, slots
        self.policy = policy
        self.lanes: dict[str, Lane] = {}
        self.holding = False

    def lane(self, channel_id: str) -> Lane:
        lane = self.lanes.get(channel_id)
        if lane is None:
            lane = self.lanes[channel_id] = Lane(self, channel_id)
            if self.holding:
                lane.held = []
        return lane

    def add(self, post: Post) -> None:
        self.lane(post.channel_id).add(post)

    def hold(self) -> None:
        """A catch-up begins: live posts wait until their channel was read."""
        self.holding = True
        for lane in self.lanes.values():
            if lane.held is None:
                lane.held = []

    async def read(self, channel_id: str, since: int) -> None:
        await self.lane(channel_id).read(since)

    def release(self) -> None:
        """The catch-up ended: every held live post is queued."""
        self.holding = False
        for lane in self.lanes.values():
            if not lane.reading.locked():
                lane.release()

    def oldest_gap(self, channel_id: str) -> int | None:
        lane = self.lanes.get(channel_id)
        return lane.gap if lane is not None else None
