"""Delivery in every serving process: the subscriptions are spread over ``PARTITIONS`` fixed
partitions, each a ``lock:`` lease (``gateway.leases``) held by one process at a time, so a
subscription is delivered by exactly one process and replicas share the work.

Sharing. Every process marks itself alive in ``lock:{notify}:members`` (a sorted set of
expiry times, ``lua/members.lua``) and aims at its share of the partitions that have an
active subscription: ceil(busy / members). Each tick (a third of the lease) it renews what it
holds, gives up what is over its share (after its runners finished the row in flight) and
takes free partitions up to its share. A process that dies stops renewing; its partitions
are free once their leases expire and another process takes them at its next tick.

Fencing. Taking a partition with token T stamps its subscriptions' ``fence`` with T; every
write of a runner carries its token, so a process that lost a lease (stalled past it) writes
nothing after its successor took over, and it stops sending once the lease's local deadline
passed (``Lease.locally_valid``, counted from before the renewal was sent).

Waking. The process listens to the ``push:`` channels of the topics its subscriptions follow
(a row small enough rides in the signal and is delivered without a read) and to
``push:gateway.subscriptions`` (a subscription made or changed: reload); every
``poll_seconds`` it reloads its subscriptions and reads the heads of their topics anyway, so a
lost signal costs at most that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg

from gateway import keys
from gateway.leases import lease as leases
from gateway.notifications import held as statements
from gateway.notifications import metrics
from gateway.notifications.cursors import CursorWriter
from gateway.notifications.held import Held
from gateway.notifications.rows import Rows
from gateway.notifications.runner import AnySender, Context, Runner
from gateway.notifications.settings import NotificationSettings
from gateway.notifications.store import CHANGES_TOPIC
from gateway.notifications.webhook import WebhookSender
from gateway.outbound.safe_http import Policy, SafeClient
from gateway.push.channel import SignalListener
from gateway.push.protocol import FeedRow
from gateway.stores.postgres import create_pool
from gateway.stores.runtime import Runtime

log = logging.getLogger("gateway.notifications")

MEMBERS_KEY = keys.lock("{notify}:members")
_MEMBERS = (Path(__file__).parent / "lua" / "members.lua").read_text()
STOP_GRACE_SECONDS = 5.0
MAX_CHANNELS = 1000  # topics listened to; a prefix covering more is found by the poll only
POOL_CONNECTIONS = 4
SUBSCRIBE_SECONDS = 2.0
FULL_RELOAD_POLLS = 30  # a full reload at least this often (polls), whatever the fingerprint

SenderFactory = Callable[[Held], AnySender]


def lease_name(part: int) -> str:
    return f"notify:{part}"


class Engine:
    def __init__(self, runtime: Runtime, settings: NotificationSettings | None = None, *,
                 client: SafeClient | None = None,
                 chat_senders: SenderFactory | None = None) -> None:
        self.runtime = runtime
        self.settings = settings or NotificationSettings.from_settings(runtime.settings)
        self.client = client or SafeClient(policy_of(self.settings))
        self.chat_senders = chat_senders
        self.holder = leases.instance_id()
        self.leases: dict[int, leases.Lease] = {}
        self.runners: dict[str, Runner] = {}
        self.heads: dict[str, tuple[int, int]] = {}
        self.pool: asyncpg.Pool | None = None
        self.context: Context | None = None
        self.listener: SignalListener | None = None
        self._listened: set[str] = set()
        self._reload = asyncio.Event()
        self._known: tuple[int, int] = (0, 0)  # the held subscriptions' fingerprint
        self._names: list[str] = []  # topics followed by name, and by prefix
        self._prefixes: list[str] = []
        self._stopping = asyncio.Event()
        self._tick_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        metrics.LAG.set_function(self.lag)

    # --- the process's part ------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop``; then let the rows in flight finish, give the partitions
        back and leave the members, so the others take over at once."""
        tick = self.settings.lease_seconds / 3
        # Listening from the start, to subscription changes at least: a subscription made
        # in a partition nobody holds is taken at once, not at the next tick.
        self.listener = SignalListener(self.runtime.cache, self._on_signal, self._on_state)
        self._tasks = [asyncio.create_task(self.listener.run(self._stopping))]
        await self.listener.add(CHANGES_TOPIC, SUBSCRIBE_SECONDS)
        self._listened = {CHANGES_TOPIC}
        relay = asyncio.create_task(self._relay(stop))  # a stop ends the wait between ticks
        try:
            while not stop.is_set():
                self._tick_now.clear()
                try:
                    await self._tick()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a store outage: the leases' deadlines rule
                    log.warning("notifications: lease round failed: %s: %s",
                                type(exc).__name__, exc)
                    self._drop_invalid()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._tick_now.wait(), tick)
        finally:
            relay.cancel()
            await self._shutdown()

    async def _relay(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._tick_now.set()

    async def _tick(self) -> None:
        durable = self.runtime.durable
        members = int(await durable.eval(_MEMBERS, 1, MEMBERS_KEY, self.holder,
                                         int(self.settings.lease_seconds * 1000)))
        held = list(self.leases.items())
        renewed = await leases.renew_many(durable, [lease for _, lease in held])
        for (part, _), ok in zip(held, renewed, strict=True):
            if not ok:
                log.warning("notifications: lease on partition %d lost", part)
                await self._let_go(part, grace=0.0)
        busy = await statements.busy_partitions(self.runtime.pg)
        share = math.ceil(len(busy) / max(1, members))
        kept = sorted(p for p in self.leases if p in busy)
        over = max(0, len(kept) - share)  # more than its share: the rest is for the others
        extra = [p for p in self.leases if p not in busy] + kept[len(kept) - over:]
        for part in extra:
            await self._let_go(part, grace=STOP_GRACE_SECONDS, release=True)
        free = [p for p in busy if p not in self.leases]
        random.shuffle(free)  # processes starting together spread over different ones
        taken = False
        for part in free:
            if len(self.leases) >= share:
                break
            taken_lease = await leases.acquire(durable, lease_name(part), self.holder,
                                               self.settings.lease_seconds)
            if taken_lease is not None:
                self.leases[part] = taken_lease
                taken = True
        if taken or extra:
            await self._start()
            self._reload.set()

    def _drop_invalid(self) -> None:
        for part, lease in list(self.leases.items()):
            if not lease.locally_valid():
                self.leases.pop(part)
                for runner in self._runners_of(part):
                    runner.stopping = True
                    runner.wake.set()

    async def _let_go(self, part: int, *, grace: float, release: bool = False) -> None:
        runners = self._runners_of(part)
        await asyncio.gather(*(r.stop(grace) for r in runners))
        for runner in runners:
            self.runners.pop(runner.held.id, None)
        lease = self.leases.pop(part, None)
        if release and lease is not None:
            with contextlib.suppress(Exception):
                await leases.release(self.runtime.durable, lease)

    def _runners_of(self, part: int) -> list[Runner]:
        return [r for r in self.runners.values() if r.held.part == part]

    def lease_valid(self, part: int) -> bool:
        lease = self.leases.get(part)
        return lease is not None and lease.locally_valid()

    # --- delivering --------------------------------------------------------------------

    async def _start(self) -> None:
        """The pool, the listener and the poll, from the first partition taken on."""
        if self.context is not None:
            return
        database_url = self.runtime.settings.database_url
        assert database_url is not None
        self.pool = await create_pool(database_url, max_size=POOL_CONNECTIONS,
                                      server_settings={"synchronous_commit": "off"})
        self.context = Context(self.pool, Rows(self.pool), CursorWriter(self.pool),
                               self.settings, self.heads, self.lease_valid,
                               self._reload.set)
        self._tasks.append(asyncio.create_task(self._poll(self._stopping)))

    async def _poll(self, stop: asyncio.Event) -> None:
        """Reload in full when asked (a partition taken, a change signalled, a write
        refused), when the held subscriptions' fingerprint moved (a change whose signal was
        lost), and every ``FULL_RELOAD_POLLS`` polls whatever; read the topics' heads every
        ``poll_seconds``."""
        polls = 0
        while not stop.is_set():
            try:
                polls += 1
                if (self._reload.is_set() or polls >= FULL_RELOAD_POLLS
                        or await self._fingerprint() != self._known):
                    self._reload.clear()
                    polls = 0
                    await self.reload()
                    await self._listen()
                if await self._read_heads():
                    await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("notifications: reload failed: %s: %s", type(exc).__name__, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reload.wait(), self.settings.poll_seconds)

    async def _fingerprint(self) -> tuple[int, int]:
        assert self.pool is not None
        return await statements.fingerprint(self.pool, list(self.leases))

    async def reload(self) -> None:
        """Take the held partitions' subscriptions as PostgreSQL has them: start, update
        and stop runners to match."""
        assert self.pool is not None and self.context is not None
        tokens = {part: lease.token for part, lease in self.leases.items()
                  if lease.locally_valid()}
        self._known = await self._fingerprint()
        found = {h.id: h for h in await statements.load(self.pool, tokens)}
        await asyncio.gather(*(self.runners.pop(sub_id).stop(STOP_GRACE_SECONDS)
                               for sub_id in [i for i in self.runners if i not in found]))
        for sub_id, fresh in found.items():
            runner = self.runners.get(sub_id)
            if runner is not None:
                runner.update(fresh)
                continue
            sender = self._sender(fresh)
            if sender is None:
                continue
            runner = self.runners[sub_id] = Runner(fresh, self.context, sender)
            runner.start()
        patterns = {r.held.topic for r in self.runners.values()}
        self._names = sorted(p for p in patterns if not p.endswith("*"))
        self._prefixes = sorted(p[:-1] for p in patterns if p.endswith("*"))
        metrics.HELD.set(len(self.runners))

    def _sender(self, held: Held) -> AnySender | None:
        if held.type == "webhook":
            assert held.secret is not None
            return WebhookSender(self.client, str(held.destination["url"]), held.secret)
        return self.chat_senders(held) if self.chat_senders else None

    async def _read_heads(self) -> bool:
        """The heads of the topics followed (waking what moved); True when a topic
        appeared that a prefix covers (to be listened to)."""
        assert self.pool is not None
        fresh = (await statements.heads(self.pool, self._names, self._prefixes)
                 if self.runners else {})
        appeared = any(topic not in self.heads for topic in fresh)
        for topic, head in fresh.items():
            self._advance(topic, head)
        return appeared

    def lag(self) -> int:
        """Rows the active subscriptions held here are behind the heads last seen
        (computed when ``/metrics`` is read, not on every poll)."""
        total = 0
        for runner in self.runners.values():
            held = runner.held
            if held.state != "active":
                continue
            topics = [held.topic] if not held.topic.endswith("*") else [
                t for t in self.heads if held.follows(t)]
            for topic in topics:
                epoch, last = self.heads.get(topic, (0, 0))
                offset, at = held.position(topic)
                total += max(0, last - (offset if at in (None, epoch) else 0))
        return total

    async def _listen(self) -> None:
        """Listen to the topics the held subscriptions follow (and to subscription changes)."""
        assert self.listener is not None
        wanted = {CHANGES_TOPIC}
        for runner in self.runners.values():
            topic = runner.held.topic
            if topic.endswith("*"):
                wanted.update(t for t in self.heads if runner.held.follows(t))
            else:
                wanted.add(topic)
        wanted = set(sorted(wanted, key=lambda t: t != CHANGES_TOPIC)[:MAX_CHANNELS])
        for topic in self._listened - wanted:
            await self.listener.remove(topic)
        new = wanted - self._listened
        self._listened = wanted
        await asyncio.gather(*(self.listener.add(t, SUBSCRIBE_SECONDS) for t in new))

    def _advance(self, topic: str, head: tuple[int, int]) -> None:
        """A topic's head moved (a signal or a poll): wake the runners that follow it."""
        known = self.heads.get(topic)
        if known is not None and (known[0], known[1]) >= head:
            return
        self.heads[topic] = head
        for runner in self.runners.values():
            if runner.held.follows(topic):
                runner.wake.set()

    def _on_signal(self, body: dict[str, Any]) -> None:
        topic = body["topic"]
        if topic == CHANGES_TOPIC:
            self._reload.set()
            self._tick_now.set()  # a new subscription's partition may be nobody's yet
            return
        row = body.get("row")
        if isinstance(row, dict) and self.context is not None:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self.context.rows.offer(FeedRow.from_json(row))
        self._advance(topic, (int(body["epoch"]), int(body["offset"])))

    def _on_state(self, up: bool) -> None:
        if up:  # signals were lost while the listener was away: look now
            self._reload.set()

    async def _shutdown(self) -> None:
        await asyncio.gather(*(self._let_go(part, grace=STOP_GRACE_SECONDS, release=True)
                               for part in list(self.leases)))
        self._stopping.set()
        for task in self._tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 5)
        if self.context is not None:
            await self.context.writer.close()
        with contextlib.suppress(Exception):
            await self.runtime.durable.zrem(MEMBERS_KEY, self.holder)
        await self.client.close()
        if self.pool is not None:
            await self.pool.close()


def policy_of(settings: NotificationSettings) -> Policy:
    return Policy(settings.allow_http, settings.allow_private_networks,
                  settings.connect_seconds, settings.request_seconds,
                  settings.max_answer_bytes, settings.max_connections)
