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


class Inbox:
    def __init__(self, redis: AnyRedis, platform: str,
                 limits: InboxLimits | None = None, auto: AutoPipeline | None = None) -> None:
        """``auto``: the per-message commands (push, ack, the checks around a send) of
        concurrent callers then share round trips and connections."""
        self.redis = redis
        self.auto = auto or AutoPipeline(redis)
        self.platform = platform
        self.limits = limits or InboxLimits()
        self.cluster = isinstance(redis, RedisCluster)
        self._scripts = inbox_scripts(redis)
        self.ready = keys.inbox(platform, "ready")
        self.leases = keys.inbox(platform, "leases")
        self.owners = keys.inbox(platform, "owners")
        self.failures = keys.inbox(platform, "failures")
        self.dead = keys.inbox(platform, "dead")
        self.sent = keys.inbox(platform, "sent")
        self.takes = keys.inbox(platform, "takes")
        self.prefix = keys.inbox(platform, "chat", "")
        self._lease_ms = str(int(self.limits.lease_seconds * 1000))

    def chat_list(self, chat: str) -> str:
        return self.prefix + chat

    # --- producers -----------------------------------------------------------------------

    async def push(self, chat: str, entry: Entry, claim_key: str | None, ttl: int) -> Pushed:
        """Make ``entry`` durable behind the claim ``claim_key`` (None: no dedup)."""
        if claim_key is not None and self.cluster:
            return await self._claim_then_push(chat, entry, claim_key, ttl)
        keys_ = [self.ready, self.leases, self.chat_list(chat)]
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
        flat = await self._scripts.take(
            keys=[self.ready, self.leases, self.owners, self.failures, self.takes],
            args=[token, self._lease_ms, count, self.prefix])
        return [Taken(_text(flat[i]), _text(flat[i + 1]), int(flat[i + 2]))
                for i in range(0, len(flat), 3)]

    async def ack(self, chat: str, token: str, head: str) -> str | Lost | None:
        """Drop the processed head; the next entry (still leased to us), None when the chat
        is done, or ``Lost.LEASE``."""
        result = await self.auto.run_script(
            self._scripts.ack,
            [self.leases, self.owners, self.failures, self.chat_list(chat), self.sent,
             self.takes],
            [chat, token, head, self._lease_ms])
        if result is None:
            return Lost.LEASE
        text = _text(result)
        return text or None

    async def release(self, chat: str, token: str, *, delay: float, counted: bool,
                      at_once: bool = False) -> bool:
        """Give the chat back, ready after ``delay`` seconds; True when a counted failure
        moved its head to the dead letters (``at_once``: this failure does)."""
        result = await self._scripts.release(
            keys=[self.ready, self.leases, self.owners, self.failures, self.chat_list(chat),
                  self.dead, self.sent, self.takes],
            args=[chat, token, int(delay * 1000), int(counted),
                  1 if at_once else self.limits.max_failures, self.limits.dead_max])
        return int(result) == 2

    async def renew(self, held: dict[str, str]) -> set[str]:
        """Extend our leases (chat → token); the chats that are no longer ours."""
        if not held:
            return set()
        args: list[Any] = [self._lease_ms]
        for chat, token in held.items():
            args += [chat, token]
        lost = await self._scripts.renew(keys=[self.leases, self.owners], args=args)
        return {_text(chat) for chat in lost}

    async def before_send(self, chat: str, token: str) -> tuple[bool, str]:
        """(we still hold the chat, what ``mark_sent`` recorded about the head's reply or
        ""), in one round trip."""
        owner, sent = await self.auto.batch([("HGET", self.owners, chat),
                                             ("HGET", self.sent, chat)])
        for reply in (owner, sent):
            if isinstance(reply, Exception):
                raise reply
        return _text(owner or "") == token, _text(sent or "")

    async def mark_sent(self, chat: str, value: str) -> None:
        """Record how far the head's reply got (the consumer's fence writes the head's
        digest, with the id of the message showing it while it is being written): a retry
        of the head must not send it again. ACK forgets it."""
        await self.auto.execute("HSET", self.sent, chat, value)

    async def reclaim(self, limit: int = 100) -> int:
        return int(await self._scripts.reclaim(
            keys=[self.ready, self.leases, self.owners, self.failures, self.dead, self.sent,
                  self.takes],
            args=[limit, self.limits.max_failures, self.limits.dead_max, self.prefix]))

    # --- operators -----------------------------------------------------------------------

    async def depth(self) -> dict[str, int]:
        """Chats waiting, chats being processed, dead letters."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(self.ready)
            pipe.zcard(self.leases)
            pipe.llen(self.dead)
            ready, leased, dead = await pipe.execute()
        return {"ready_chats": int(ready), "leased_chats": int(leased), "dead": int(dead)}


_PUSHED = {1: Pushed.ACCEPTED, 0: Pushed.DUPLICATE, -1: Pushed.FULL}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
