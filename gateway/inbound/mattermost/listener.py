"""The Mattermost listener: one active replica, a resilient socket, nothing missed, nothing
answered twice.

- **One active listener.** A replica first takes the ``lock:`` lease (``gateway.leases.lease``);
  standbys poll for it. The holder renews it every third of its TTL; a holder that cannot
  renew in time, or finds the lease taken, stops the session. Before every reply it checks
  that its fencing token is still the current one, so a holder that lost its lease (paused,
  partitioned) never answers next to its successor.
- **Socket.** Authenticate with the challenge, wait for ``hello``, read ``posted`` events.
  Any drop (close 1000/1011, abort, refused upgrade, failed auth) leads to a reconnect after
  an exponential delay with jitter; a connection that stayed up ``healthy_after`` seconds
  resets the delay.
- **Catch-up.** After every ``hello`` the listener lists its channels over REST and reads the
  posts since the last post it saw there, minus a margin (clock skew, posts committed late);
  for a channel it has not seen yet in this lease, since ``catchup_lookback`` seconds before
  the lease was taken (what a dead predecessor may have missed).
- **Durable, in order.** Live and caught-up posts alike are claimed
  (``dedup:mattermost-post:<id>``) and put in the inbox in one step (``accept``); the first
  claim wins, every other delivery is dropped. A channel's posts are taken in one after the
  other, in the channel's order (``lanes.py``): a post whose intake failed is retried before
  the ones after it, and live posts wait while a catch-up reads their channel. Answering is
  the inbox consumer's job, on whichever replica is alive.
- **Health flag.** The holder keeps ``cache:mattermost:listener`` fresh (see
  ``health.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
from redis.exceptions import RedisError

from gateway.inbound.mattermost import health
from gateway.inbound.mattermost.backoff import Backoff
from gateway.inbound.mattermost.client import (
    MattermostClient,
    MattermostError,
    Post,
    SocketClosed,
    posted_post,
)
from gateway.inbound.mattermost.lanes import LanePolicy, Lanes
from gateway.leases import lease as leases
from gateway.leases.maintenance import view_for
from gateway.stores.runtime import Runtime

log = logging.getLogger("gateway.mattermost")

LEASE_NAME = "mattermost-listener"

# Makes one post durable (claim + inbox); raises when it could not (the post is retried).
Accept = Callable[[Post], Awaitable[None]]

_NETWORK_ERRORS = (SocketClosed, MattermostError, aiohttp.ClientError, TimeoutError, OSError)


@dataclass(frozen=True)
class ListenerConfig:
    """Timings in seconds; the defaults suit production, tests shrink them."""

    url: str
    token: str
    lease_seconds: float = 15.0
    health_ttl: float = health.DEFAULT_TTL
    health_interval: float = 10.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    healthy_after: float = 60.0
    catchup_margin: float = 5.0
    catchup_lookback: float = 120.0
    ws_heartbeat: float = 30.0
    hello_timeout: float = 30.0
    dedup_ttl: int = 86400
    max_concurrent: int = 8
    drain_seconds: float = 5.0
    max_queued: int = 1000  # posts waiting per channel; past it they are read again later


async def _stopped(stop: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``stop``; true when it was set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout)
    return stop.is_set()


class Listener:
    def __init__(self, runtime: Runtime, config: ListenerConfig, accept: Accept,
                 *, instance: str | None = None) -> None:
        self.runtime = runtime
        self.config = config
        self.accept = accept
        self.instance = instance or leases.instance_id()
        self.state = health.ListenerState(self.instance)
        self.bot_user_id = ""
        self.lease: leases.Lease | None = None  # set while this replica is the active one
        self._last_seen: dict[str, int] = {}
        self._lanes: Lanes | None = None  # this lease's, per channel
        self._user_names: dict[str, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(config.max_concurrent)
        # One write at a time, each serialising the state when it runs: a slow earlier write
        # (a heartbeat) can then never land after, and undo, a newer one (the hello).
        self._publishing = asyncio.Lock()

    # --- lease ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Stand by for the lease, hold it while it lasts, repeat until ``stop`` is set."""
        session_timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(timeout=session_timeout) as session:
            client = MattermostClient(self.config.url, self.config.token, session)
            while not stop.is_set():
                lease = await self._wait_for_lease(stop)
                if lease is None:
                    return
                log.info("mattermost listener %s active (fencing token %d)",
                         self.instance, lease.token)
                self.lease = lease
                try:
                    await self._hold(client, lease, stop)
                except Exception:  # a bug must not end the listener of a whole deployment
                    log.exception("mattermost listener %s failed; standing by", self.instance)
                    await _stopped(stop, self.config.backoff_max)
                finally:
                    self.lease = None

    async def _wait_for_lease(self, stop: asyncio.Event) -> leases.Lease | None:
        poll = min(1.0, self.config.lease_seconds / 5)
        while not stop.is_set():
            try:
                lease = await leases.acquire(self.runtime.durable, LEASE_NAME, self.instance,
                                             self.config.lease_seconds)
            except RedisError as exc:
                log.warning("mattermost listener: cannot reach redis-durable: %s", exc)
                lease = None
            if lease is not None:
                return lease
            await _stopped(stop, poll)
        return None

    async def _hold(self, client: MattermostClient, lease: leases.Lease,
                    stop: asyncio.Event) -> None:
        lost = asyncio.Event()
        self.state = health.ListenerState(self.instance)
        self.state.set_connected(False)
        self._last_seen = {}
        self._lanes = Lanes(
            lambda post: self._process(client, lease, post), client.posts_since, self._spawn,
            self._slots, LanePolicy(max_queued=self.config.max_queued,
                                    backoff_initial=self.config.backoff_initial,
                                    backoff_max=self.config.backoff_max))
        floor_ms = int((time.time() - self.config.catchup_lookback) * 1000)
        renewer = asyncio.create_task(self._renew(lease, lost))
        beat = asyncio.create_task(self._heartbeat(lease))
        session = asyncio.create_task(self._session(client, lease, floor_ms))
        waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(lost.wait())]
        try:
            await asyncio.wait([session, *waiters], return_when=asyncio.FIRST_COMPLETED)
        finally:
            await _cancel(session, *waiters)
            await self._drain()
            await _cancel(renewer, beat)
        failure = session.exception() if session.done() and not session.cancelled() else None
        if lost.is_set():
            log.warning("mattermost listener %s lost its lease; standing by", self.instance)
            return
        await self._step_down(lease)
        if failure is not None:
            raise failure  # after stepping down: another replica may take over meanwhile

    async def _step_down(self, lease: leases.Lease) -> None:
        """Clean stop: drop our flag first (no successor can have written it yet), then the
        lease, so a standby takes over at once instead of after the TTL."""
        with contextlib.suppress(RedisError):
            await health.clear(self.runtime.cache, self.instance)
        with contextlib.suppress(RedisError):
            await leases.release(self.runtime.durable, lease)

    async def _renew(self, lease: leases.Lease, lost: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(lease.ttl / 3)
            try:
                if not await leases.renew(self.runtime.durable, lease):
                    break
            except RedisError as exc:
                log.warning("mattermost listener: lease renewal failed: %s", exc)
                if not lease.locally_valid():
                    break
        lost.set()

    # --- health flag -------------------------------------------------------------------

    async def _heartbeat(self, lease: leases.Lease) -> None:
        while lease.locally_valid():
            await self._publish()
            await asyncio.sleep(self.config.health_interval)

    async def _publish(self) -> None:
        if self.lease is None or not self.lease.locally_valid():
            return  # a holder that lost its lease must not overwrite its successor's flag
        try:
            async with self._publishing:
                await health.publish(self.runtime.cache, self.state, self.config.health_ttl)
        except RedisError as exc:  # losing redis-cache changes no outcome
            log.warning("mattermost listener: health flag not written: %s", exc)

    # --- socket ------------------------------------------------------------------------

    async def _session(self, client: MattermostClient, lease: leases.Lease,
                       floor_ms: int) -> None:
        backoff = Backoff(self.config.backoff_initial, self.config.backoff_max)
        maintenance = view_for(self.runtime.durable)
        while True:
            # Off the socket while maintenance is on; the catch-up after it answers what was
            # posted meanwhile.
            await maintenance.wait_until_off()
            connected_at: float | None = None
            try:
                # A server that accepts the socket but never says hello counts as a drop.
                async with asyncio.timeout(self.config.hello_timeout) as until_hello:
                    if not self.bot_user_id:
                        self.bot_user_id = str((await client.me())["id"])
                    async with client.events(self.config.ws_heartbeat) as stream:
                        async for event in stream:
                            await self._on_event(client, lease, event, floor_ms)
                            if connected_at is None and self.state.connected:
                                connected_at = time.monotonic()
                                until_hello.reschedule(None)
            except _NETWORK_ERRORS as exc:
                if _cancelling():
                    raise asyncio.CancelledError from exc
                log.warning("mattermost socket: %s", exc)
            if connected_at is not None:
                self.state.reconnects += 1
                if time.monotonic() - connected_at >= self.config.healthy_after:
                    backoff.reset()
            self.state.set_connected(False)
            await self._publish()
            await asyncio.sleep(backoff.next())

    async def _on_event(self, client: MattermostClient, lease: leases.Lease,
                        event: dict[str, Any], floor_ms: int) -> None:
        self.state.saw_event()
        assert self._lanes is not None
        if event.get("event") == "hello":
            self.state.set_connected(True)
            await self._publish()
            # Live posts wait until their channel was read; snapshot now: live posts after
            # hello must not move the catch-up's start.
            self._lanes.hold()
            self._spawn(self._catch_up(client, self._lanes, dict(self._last_seen), floor_ms))
            return
        post = posted_post(event)
        if post is not None:
            if (await view_for(self.runtime.durable).current()).on:
                raise SocketClosed("maintenance mode: leaving the socket until it ends")
            self._lanes.add(post)

    async def _catch_up(self, client: MattermostClient, lanes: Lanes, seen: dict[str, int],
                        floor_ms: int) -> None:
        """Read, per channel, what was posted while the socket was down, and answer it."""
        margin_ms = int(self.config.catchup_margin * 1000)
        try:
            for channel_id in await client.my_channel_ids():
                gap = lanes.oldest_gap(channel_id)
                since = min(seen.get(channel_id, floor_ms + margin_ms),
                            gap if gap is not None else math.inf)
                await lanes.read(channel_id, int(since) - margin_ms)
        except _NETWORK_ERRORS as exc:
            log.warning("mattermost catch-up incomplete (next reconnect retries): %s", exc)
        finally:
            lanes.release()

    # --- one post ----------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        """Let posts in flight finish (bounded), then cancel what is left."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.config.drain_seconds)
            await _cancel(*self._tasks)

    def _wanted(self, post: Post) -> bool:
        """Humans' posts only: not the bot's own replies, system messages or deleted posts."""
        return (post.user_id != self.bot_user_id and not post.type.startswith("system_")
                and not post.delete_at and bool(post.message.strip()))

    async def _process(self, client: MattermostClient, lease: leases.Lease, post: Post) -> None:
        """Make one post durable; raises when its intake failed (it is tried again)."""
        seen = self._last_seen.get(post.channel_id, 0)
        self._last_seen[post.channel_id] = max(seen, post.create_at)
        if not self._wanted(post):
            return
        if not lease.locally_valid():
            return  # no longer ours to take in: the successor's catch-up reads it
        post = dataclasses.replace(post, user_name=await self._user_name(client, post))
        await self.accept(post)

    async def _user_name(self, client: MattermostClient, post: Post) -> str:
        """The author's username (cached per process); the id when the lookup fails."""
        if post.user_id not in self._user_names:
            try:
                user = await client.user(post.user_id)
            except _NETWORK_ERRORS:
                return post.user_id
            self._user_names[post.user_id] = str(user.get("username") or post.user_id)
        return self._user_names[post.user_id]


def _cancelling() -> bool:
    """Was this task asked to stop (even if a library turned that into another error)?"""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    """Cancel and reap. A library may turn a cancellation that races with its own timeout
    into a ``TimeoutError`` and carry on, so cancel again until every task is done."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" noise
