"""The one module that talks Redis pub/sub for push signals.

Keeping PUBLISH (and, later, SUBSCRIBE) here means sharded pub/sub (SPUBLISH/SSUBSCRIBE on
Redis Cluster) can replace them in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.asyncio.cluster import RedisCluster

from gateway import keys
from gateway.push import metrics
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.redis import AnyRedis
from gateway.stores.scripts import bound_scripts

log = logging.getLogger("gateway.push")
IDLE_CHANNEL = keys.push_channel("gateway.idle")


_string = json.encoder.encode_basestring_ascii

# A row whose JSON is at most this long travels inside its signal as ``"row"``.
INLINE_ROW_MAX_CHARS = 8192


def signal_body(topic: str, offset: int, kind: str, epoch: int,
                row_wire: str | None = None) -> str:
    # What json.dumps of the dict writes (compact, ASCII), without building the dict and an
    # encoder for it: a chat message signals twice.
    head = (f'{{"topic":{_string(topic)},"offset":{int(offset)},"kind":{_string(kind)},'
            f'"epoch":{int(epoch)}}}')
    if row_wire is None or len(row_wire) > INLINE_ROW_MAX_CHARS:
        return head
    return f'{head[:-1]},"row":{row_wire}}}'  # the row is JSON already: no second encoding


def parse_signal(data: Any) -> dict[str, Any] | None:
    """A signal as a dict, or None when it is not one of ours (never raises)."""
    try:
        body = json.loads(data)
        if (isinstance(body, dict) and isinstance(body.get("topic"), str)
                and isinstance(body.get("offset"), int) and isinstance(body.get("epoch"), int)):
            return body
    except (TypeError, ValueError):
        pass
    return None


# After a failed PUBLISH, skip publishing on that client for this long: while redis-cache is
# down every PUBLISH would wait out redis-py's connection retries, slowing every writer that
# signals, for a signal that polling replaces anyway.
SKIP_AFTER_FAILURE_SECONDS = 1.0
PUBLISH_TIMEOUT_SECONDS = 1.0
_down_until: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


# One signal: topic, offset, kind, epoch and the row's JSON (None: not carried).
Signal = tuple[str, int, str, int, str | None]


async def publish_signal(cache: AnyRedis, topic: str, offset: int, kind: str,
                         epoch: int, row_wire: str | None = None) -> bool:
    """PUBLISH on ``push:<topic>``; see ``publish_signals``."""
    return await publish_signals(cache, [(topic, offset, kind, epoch, row_wire)])


async def publish_signals(cache: AnyRedis, signals: Sequence[Signal],
                          auto: AutoPipeline | None = None) -> bool:
    """PUBLISH each signal on its ``push:<topic>``; see ``publish_bodies``."""
    return await publish_bodies(cache, signal_bodies(signals), auto)


def signal_bodies(signals: Sequence[Signal]) -> list[tuple[str, str]]:
    """(topic, signal body) of each signal, as ``publish_bodies`` and its ``_soon`` take."""
    return [(signal[0], signal_body(*signal)) for signal in signals]


async def publish_bodies(cache: AnyRedis, bodies: Sequence[tuple[str, str]],
                         auto: AutoPipeline | None = None) -> bool:
    """PUBLISH each (topic, signal body) on its ``push:<topic>``, several in one round trip,
    in the order given. Pub/sub is at-most-once anyway, so a failure is logged and swallowed
    (polling the feed cures a lost signal), and for a second after one this client skips
    publishing. Returns whether the signals were sent. ``auto`` (a coalescer on ``cache``;
    not on a cluster, whose pipeline cannot route a keyless PUBLISH): the signals ride with
    the concurrent callers' commands, one round trip for them all."""
    if not bodies:
        return True
    if _skipping(cache, len(bodies)):
        return False
    messages = [(keys.push_channel(topic), body) for topic, body in bodies]
    try:
        async with asyncio.timeout(PUBLISH_TIMEOUT_SECONDS):
            if auto is not None and not auto.cluster:
                _raise_first(await auto.batch([("PUBLISH", *m) for m in messages]))
            elif len(messages) == 1:
                await cache.publish(*messages[0])
            elif isinstance(cache, RedisCluster):
                # A cluster pipeline cannot route keyless PUBLISH; one after another keeps
                # the signals in offset order (a round trip each, on a cluster only).
                for message in messages:
                    await cache.publish(*message)
            else:  # one script call: one command to pack and one reply, not one each
                await _scripts(cache).publish(
                    keys=[], args=[arg for message in messages for arg in message])
        metrics.SIGNALS.labels("sent").inc(len(bodies))
        return True
    except Exception as exc:  # redis down, OOM, timeout: never fail the committed write
        _failed(cache, bodies, exc)
        return False


def publish_bodies_soon(cache: AnyRedis, bodies: Sequence[tuple[str, str]],
                        auto: AutoPipeline | None) -> bool:
    """``publish_bodies`` without waiting for Redis: the PUBLISHes join ``auto``'s next flush
    (after every command queued on it before, in the order given) and their outcome is
    counted, and a failure logged and skipped after, when the replies come. For a writer
    that has nothing to wait for: a signal is at-most-once either way, and a caller awaiting
    it resumed its whole chain of coroutines for nothing. False when it could not be queued
    that way (no coalescer, or a cluster's, which cannot route a keyless PUBLISH): then use
    ``publish_bodies``."""
    if auto is None or auto.cluster:
        return False
    if not bodies or _skipping(cache, len(bodies)):
        return True
    try:
        sent = auto.submit([("PUBLISH", keys.push_channel(topic), body)
                            for topic, body in bodies])
    except Exception as exc:  # an argument Redis cannot take: as a failed PUBLISH
        _failed(cache, bodies, exc)
        return True
    sent.add_done_callback(lambda done: _counted(cache, bodies, done))
    return True


def _counted(cache: AnyRedis, bodies: Sequence[tuple[str, str]],
             done: asyncio.Future[list[Any]]) -> None:
    """The outcome of ``publish_bodies_soon``'s PUBLISHes, counted as ``publish_bodies``
    counts its own."""
    try:
        _raise_first(done.result())
    except (Exception, asyncio.CancelledError) as exc:
        _failed(cache, bodies, exc)
        return
    metrics.SIGNALS.labels("sent").inc(len(bodies))


def _raise_first(replies: list[Any]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def _skipping(cache: AnyRedis, count: int) -> bool:
    """Within a second of a failed PUBLISH on this client: skip (and count) the signals."""
    if _down_until.get(cache, 0.0) > time.monotonic():
        metrics.SIGNALS.labels("skipped").inc(count)
        return True
    return False


def _failed(cache: AnyRedis, bodies: Sequence[tuple[str, str]],
            exc: BaseException) -> None:
    metrics.SIGNALS.labels("failed").inc(len(bodies))
    _down_until[cache] = time.monotonic() + SKIP_AFTER_FAILURE_SECONDS
    log.warning("%d push signal(s) on %s not sent (%s); skipping signals for %g s",
                len(bodies), bodies[0][0], type(exc).__name__, SKIP_AFTER_FAILURE_SECONDS)


@dataclass(frozen=True)
class _Scripts:
    publish: Any


_SOURCES = {"publish": (Path(__file__).parent / "lua" / "publish.lua").read_text()}


def _scripts(cache: AnyRedis) -> _Scripts:
    return bound_scripts(cache, _Scripts, _SOURCES)


class SignalListener:
    """One Redis pub/sub connection for the whole process, subscribed to the ``push:``
    channel of every topic some local client follows.

    ``run`` keeps it connected: on a failure it reports ``on_state(False)``, reconnects with
    backoff, re-subscribes, and reports ``on_state(True)`` once every channel is confirmed
    (the caller then re-reads the feed: signals sent while it was away are gone).
    """

    def __init__(self, cache: AnyRedis, on_signal: Callable[[dict[str, Any]], None],
                 on_state: Callable[[bool], None]) -> None:
        self._cache = cache
        self._on_signal = on_signal
        self._on_state = on_state
        self._wanted: set[str] = set()
        self._confirmed: dict[str, asyncio.Event] = {}
        self._pubsub: Any = None
        self._send_lock = asyncio.Lock()
        self.connected = False

    async def add(self, topic: str, timeout: float) -> bool:
        """Subscribe to a topic's channel; True once Redis confirmed it within ``timeout``."""
        channel = keys.push_channel(topic)
        event = self._confirmed.setdefault(channel, asyncio.Event())
        if channel not in self._wanted:
            self._wanted.add(channel)
            await self._send("subscribe", channel)
        if not self.connected:
            return False  # redis-cache is down: do not make the caller wait; it polls
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def remove(self, topic: str) -> None:
        channel = keys.push_channel(topic)
        if channel in self._wanted:
            self._wanted.discard(channel)
            self._confirmed.pop(channel, None)
            await self._send("unsubscribe", channel)

    async def _send(self, command: str, channel: str) -> None:
        pubsub = self._pubsub
        if pubsub is None:
            return  # the next connection subscribes to everything wanted
        try:
            async with self._send_lock:
                await getattr(pubsub, command)(channel)
        except Exception as exc:  # the reader notices the broken connection and reconnects
            log.debug("push %s %s failed: %s", command, channel, type(exc).__name__)

    async def run(self, stop: asyncio.Event, backoff_cap: float = 2.0) -> None:
        backoff = 0.05
        while not stop.is_set():
            self._pubsub = self._cache.pubsub()
            try:
                await self._session_until(stop)
                backoff = 0.05
            except Exception as exc:
                log.warning("push signals unavailable (%s: %s); polling the feed",
                            type(exc).__name__, exc)
            finally:
                self._set_state(False)
                pubsub, self._pubsub = self._pubsub, None
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, backoff_cap)

    async def _session_until(self, stop: asyncio.Event) -> None:
        """The session, ended by ``stop`` at once: its read waits up to a second for a
        message, which held every process's shutdown (and every test app's close) that long."""
        session = asyncio.ensure_future(self._session(stop))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((session, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not session.done():
                session.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await session
        if not session.cancelled():
            session.result()  # its error, for run() to report and reconnect

    async def _session(self, stop: asyncio.Event) -> None:
        # A cluster client learns its slot map lazily; its pub/sub needs it to pick a node.
        # (Classic PUBLISH reaches every node of a cluster, so any node will do.)
        await self._cache.initialize()
        pubsub = self._pubsub
        for event in self._confirmed.values():
            event.clear()
        # The idle channel keeps the connection subscribed (so readable) with no topics; it is
        # a push: channel of a topic nobody writes.
        async with self._send_lock:
            await pubsub.subscribe(IDLE_CHANNEL, *self._wanted)
        resync = True
        idle_seen = False
        while not stop.is_set():
            message = await pubsub.get_message(timeout=1.0)
            if message is None:
                continue
            kind, channel = message["type"], message["channel"]
            if kind == "subscribe":
                # redis-py may reconnect and re-subscribe by itself: a second confirmation of
                # a channel means signals were lost in between, so the caller must re-read.
                confirmed = self._confirmed.get(channel)
                if (confirmed is not None and confirmed.is_set()) or (
                        channel == IDLE_CHANNEL and idle_seen):
                    resync = True
                idle_seen = idle_seen or channel == IDLE_CHANNEL
                if confirmed is not None:
                    confirmed.set()
                if resync and message["data"] >= len(self._wanted) + 1:
                    resync = False
                    self.connected = True
                    self._on_state(True)
            elif kind == "message":
                body = parse_signal(message["data"])
                if body is not None:
                    self._on_signal(body)

    def _set_state(self, up: bool) -> None:
        if not up:
            self.connected = False
            for event in self._confirmed.values():
                event.clear()
        self._on_state(up)
