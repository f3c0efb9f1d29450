"""One platform's inbox on redis-durable: push, take, ack, release, renew, reclaim.

Every message of a chat goes to that chat's list; a chat, not a message, is what a consumer
leases, so one chat is processed by one consumer at a time in arrival order while other
chats run in parallel on every replica. A consumer that dies leaves its leases to expire;
``reclaim`` makes those chats ready again and the head entry is processed again (the
conversation service stores a redelivered message once and answers it once).

Single instance and Sentinel: ``push`` is one script that takes the dedup claim and appends
the entry together, so an acknowledged event is always in the inbox. Redis Cluster: the
claim (``dedup:*``) and the inbox hash to different slots; the claim is taken first as
``in-progress`` with a short TTL, the entry appended, then the claim marked ``done``. A retry
that meets a claim still ``in-progress`` is answered ``IN_PROGRESS`` (the route's 503 +
``Retry-After``), not ``DUPLICATE``: the first attempt may yet fail and release the claim, and
a platform told "done" would never send the event again. A process that dies between the two
leaves a claim that expires within ``CLAIM_SECONDS``, after which the platform's retry is
accepted.

Shards (``GATEWAY_INBOX_SHARDS``): the keys spread over N hash tags, a chat's all in the shard
its id hashes to, so on Redis Cluster N masters share the traffic and every script still
touches one slot. Shard 0 is today's ``{inbox}``.
"""

from __future__ import annotations

import asyncio
import enum
import secrets
from dataclasses import dataclass
from typing import Any

from redis.asyncio.cluster import RedisCluster

from gateway import keys
from gateway.dedup import claims
from gateway.inbox.entry import Entry
from gateway.inbox.scripts import inbox_scripts
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.redis import AnyRedis

CLAIM_SECONDS = 30  # the cluster path's in-progress claim


class Pushed(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    FULL = "full"  # the chat has max_per_chat entries waiting: refuse, the platform retries
    # Cluster only: another attempt holds the claim in-progress and may still fail; refuse,
    # the platform retries, and the retry finds the claim done (duplicate) or released.
    IN_PROGRESS = "in-progress"


class Lost(enum.Enum):
    """``ack``: the lease is no longer ours (it expired and the chat was reclaimed)."""

    LEASE = "lease"


@dataclass(frozen=True)
class Taken:
    chat: str
    head: str  # the encoded entry, as stored (ack compares it)
    # Earlier attempts at the head: failed, reclaimed, or given back uncounted (a store
    # outage, a shutdown); any of them may have sent part of its reply.
    attempts: int = 0


@dataclass(frozen=True)
class InboxLimits:
    lease_seconds: float = 30.0
    max_per_chat: int = 1000
    max_failures: int = 10
    dead_max: int = 10_000


def new_token() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True)
class Shard:
    """One shard's keys: everything TAKE/ACK/RELEASE/RECLAIM touch together shares its tag."""

    ready: str
    leases: str
    owners: str
    failures: str
    dead: str
    sent: str
    takes: str
    prefix: str  # + chat = the chat's entry list

    @classmethod
    def of(cls, platform: str, tag: str) -> Shard:
        def key(*parts: str) -> str:
            return keys.inbox(platform, *parts, tag=tag)
        return cls(key("ready"), key("leases"), key("owners"), key("failures"), key("dead"),
                   key("sent"), key("takes"), key("chat", ""))


class Inbox:
    def __init__(self, redis: AnyRedis, platform: str,
                 limits: InboxLimits | None = None, auto: AutoPipeline | None = None,
                 shards: int = 1) -> None:
        """``auto``: the per-message commands (push, ack, the checks around a send) of
        concurrent callers then share round trips and connections. ``shards``: how many hash
        tags the chats spread over (``GATEWAY_INBOX_SHARDS``; 1 = the ``{inbox}`` keys
        alone); a chat's keys are all in the shard its id hashes to."""
        self.redis = redis
        self.auto = auto or AutoPipeline(redis)
        self.platform = platform
        self.limits = limits or InboxLimits()
        self.cluster = isinstance(redis, RedisCluster)
        self._scripts = inbox_scripts(redis)
        self.shards = tuple(Shard.of(platform, tag)
                            for tag in keys.shard_tags(keys.INBOX_TAG, shards))
        self._next_take = 0  # the shard the next TAKE starts at: each poll begins elsewhere
        # Chats held from a shard other than the one their id hashes to (entries pushed
        # before the shard count changed, e.g. under ``{inbox}`` alone): what follows a TAKE
        # goes to the shard the chat was taken from.
        self._moved: dict[str, Shard] = {}
        self._lease_ms = str(int(self.limits.lease_seconds * 1000))

    def shard(self, chat: str) -> Shard:
        """The shard of a chat: the one it was taken from while held, else its id's."""
        return self._moved.get(chat) or self.shards[keys.shard_index(chat, len(self.shards))]

    def chat_list(self, chat: str) -> str:
        return self.shard(chat).prefix + chat

    # --- producers -----------------------------------------------------------------------

    async def push(self, chat: str, entry: Entry, claim_key: str | None, ttl: int) -> Pushed:
        """Make ``entry`` durable behind the claim ``claim_key`` (None: no dedup)."""
        if claim_key is not None and self.cluster:
            return await self._claim_then_push(chat, entry, claim_key, ttl)
        shard = self.shard(chat)
        keys_ = [shard.ready, shard.leases, shard.prefix + chat]
        if claim_key is not None:
            keys_.append(claim_key)
        result = await self.auto.run_script(self._scripts.push, keys_, [
            chat, entry.encode(), self.limits.max_per_chat, ttl])
        return _PUSHED[int(result)]

    async def _claim_then_push(self, chat: str, entry: Entry, claim_key: str,
                               ttl: int) -> Pushed:
        claim = await claims.claim(self.redis, claim_key, CLAIM_SECONDS)
        if claim.outcome is claims.Outcome.IN_PROGRESS:
            return Pushed.IN_PROGRESS
        if not claim.claimed:
            return Pushed.DUPLICATE
        try:
            pushed = await self.push(chat, entry, None, ttl)
        except asyncio.CancelledError:  # the request's budget ran out: do not wait on a store
            self.auto.send_nowait([claims.release_command(claim)])
            raise
        except BaseException:
            await claims.release(self.redis, claim)
            raise
        if pushed is Pushed.ACCEPTED:
            await claims.mark_done(self.redis, claim, ttl)
        else:
            await claims.release(self.redis, claim)
        return pushed

    # --- consumers -----------------------------------------------------------------------

    async def take(self, token: str, count: int) -> list[Taken]:
        """Lease up to ``count`` ready chats, longest waiting first within a shard. The shards
        are asked in turn from a start that moves on by one every call (fair to all), the
        next one only for what the previous could not give: one call on one shard."""
        taken: list[Taken] = []
        start, total = self._next_take, len(self.shards)
        self._next_take = (start + 1) % total
        for offset in range(total):
            if len(taken) >= count:
                break
            shard = self.shards[(start + offset) % total]
            flat = await self._scripts.take(
                keys=[shard.ready, shard.leases, shard.owners, shard.failures, shard.takes],
                args=[token, self._lease_ms, count - len(taken), shard.prefix])
            for i in range(0, len(flat), 3):
                taken.append(Taken(_text(flat[i]), _text(flat[i + 1]), int(flat[i + 2])))
                self._moved.pop(taken[-1].chat, None)
                if self.shard(taken[-1].chat) is not shard:
                    self._moved[taken[-1].chat] = shard
        return taken

    async def ack(self, chat: str, token: str, head: str) -> str | Lost | None:
        """Drop the processed head; the next entry (still leased to us), None when the chat
        is done, or ``Lost.LEASE``."""
        shard = self.shard(chat)
        result = await self.auto.run_script(
            self._scripts.ack,
            [shard.leases, shard.owners, shard.failures, shard.prefix + chat, shard.sent,
             shard.takes],
            [chat, token, head, self._lease_ms])
        if result is None:
            self._moved.pop(chat, None)
            return Lost.LEASE
        text = _text(result)
        if not text:
            self._moved.pop(chat, None)
        return text or None

    async def release(self, chat: str, token: str, *, delay: float, counted: bool,
                      at_once: bool = False) -> bool:
        """Give the chat back, ready after ``delay`` seconds; True when a counted failure
        moved its head to the dead letters (``at_once``: this failure does)."""
        shard = self.shard(chat)
        result = await self._scripts.release(
            keys=[shard.ready, shard.leases, shard.owners, shard.failures, shard.prefix + chat,
                  shard.dead, shard.sent, shard.takes],
            args=[chat, token, int(delay * 1000), int(counted),
                  1 if at_once else self.limits.max_failures, self.limits.dead_max])
        self._moved.pop(chat, None)
        return int(result) == 2

    async def renew(self, held: dict[str, str]) -> set[str]:
        """Extend our leases (chat → token); the chats that are no longer ours. One call per
        shard that holds any of them."""
        by_shard: dict[Shard, list[Any]] = {}
        for chat, token in held.items():
            by_shard.setdefault(self.shard(chat), [self._lease_ms]).extend((chat, token))
        lost: set[str] = set()
        for shard, args in by_shard.items():
            lost.update(_text(chat) for chat in await self._scripts.renew(
                keys=[shard.leases, shard.owners], args=args))
        for chat in lost:
            self._moved.pop(chat, None)
        return lost

    async def before_send(self, chat: str, token: str,
                          asked: asyncio.Future[list[Any]] | None = None) -> tuple[bool, str]:
        """(we still hold the chat, what ``mark_sent`` recorded about the head's reply or
        ""), in one round trip; ``asked``: the answer of ``before_send_soon``, queued ahead."""
        owner, sent = await (self.before_send_soon(chat) if asked is None else asked)
        for reply in (owner, sent):
            if isinstance(reply, Exception):
                raise reply
        return _text(owner or "") == token, _text(sent or "")

    def before_send_soon(self, chat: str) -> asyncio.Future[list[Any]]:
        """Queue ``before_send``'s question now, with whatever else the caller queues in this
        turn of the loop (one round trip for them all); its raw replies."""
        shard = self.shard(chat)
        return self.auto.submit([("HGET", shard.owners, chat), ("HGET", shard.sent, chat)])

    async def mark_sent(self, chat: str, value: str) -> None:
        """Record how far the head's reply got (the consumer's fence writes the head's
        digest, with the id of the message showing it while it is being written): a retry
        of the head must not send it again. ACK forgets it."""
        await self.auto.execute("HSET", self.shard(chat).sent, chat, value)

    def mark_sent_soon(self, chat: str, value: str) -> asyncio.Future[list[Any]]:
        """``mark_sent`` without waiting: queued on the coalescer now, so it reaches Redis
        before anything the caller queues after it (the head's ACK); the future of its
        reply."""
        return self.auto.submit([("HSET", self.shard(chat).sent, chat, value)])

    async def reclaim(self, limit: int = 100) -> int:
        """Make the chats of expired leases ready again, up to ``limit`` per shard."""
        reclaimed = 0
        for shard in self.shards:
            reclaimed += int(await self._scripts.reclaim(
                keys=[shard.ready, shard.leases, shard.owners, shard.failures, shard.dead,
                      shard.sent, shard.takes],
                args=[limit, self.limits.max_failures, self.limits.dead_max, shard.prefix]))
        return reclaimed

    # --- operators -----------------------------------------------------------------------

    async def depth(self) -> dict[str, int]:
        """Chats waiting, chats being processed, dead letters (summed over the shards)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in self.shards:
                pipe.zcard(shard.ready)
                pipe.zcard(shard.leases)
                pipe.llen(shard.dead)
            replies = [int(reply) for reply in await pipe.execute()]
        return {"ready_chats": sum(replies[0::3]), "leased_chats": sum(replies[1::3]),
                "dead": sum(replies[2::3])}


_PUSHED = {1: Pushed.ACCEPTED, 0: Pushed.DUPLICATE, -1: Pushed.FULL}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
