"""Deliver one reply: pass the platform limits, retry, and dead-letter what still fails.

A limited send waits; a platform 429 is retried after its Retry-After without counting as a
failure; any other error is retried with exponential backoff, and after the last attempt the
reply goes to the ``undelivered_replies`` table (PostgreSQL, the system of record) and is
logged. Nothing is dropped silently. redis-durable out of reach (the limiter's buckets, or the
fence inside ``send``) is no fault of the reply: ``StoreOutage`` goes to the caller, which
gives the message back uncounted, and the stored reply is sent when it is retried.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import asyncpg

from gateway.config import Settings, field_types, positive_numbers
from gateway.outbound.errors import StoreOutage, Undeliverable, retry_after_of
from gateway.ratelimit import Limiter, Rate
from gateway.stores.redis import UNREACHABLE

log = logging.getLogger("gateway.outbound")

# Hands one reply text to the platform; raises what the platform answered.
Send = Callable[[str], Awaitable[None]]
Db: TypeAlias = "asyncpg.Connection | asyncpg.Pool"


class Destination(Protocol):
    """Where a reply goes: the platform's chat (a conversation's ``Incoming`` is one)."""

    @property
    def platform(self) -> str: ...
    @property
    def chat(self) -> str: ...
    @property
    def thread(self) -> str | None: ...
    @property
    def team(self) -> str | None: ...


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5  # failures before the dead letter
    backoff: float = 0.5  # first wait after a failure, doubled each time
    backoff_max: float = 30.0
    rate_limited_max: int = 20  # platform 429s tolerated for one reply (each waits)

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        values: dict[str, Any] = positive_numbers(settings.section("outbound"),
                                                  field_types(cls), "GATEWAY_CONFIG [outbound]")
        return cls(**values)


def limit_names(incoming: Destination, table: Mapping[str, Mapping[str, Rate]], *,
                edit: bool = False) -> list[tuple[str, Rate]]:
    """The limiter buckets one reply to this chat passes (per bot, group, chat or channel);
    with ``edit``, what an edit of a reply passes: those, and the ``edit`` scope (per bot or
    workspace: Slack's chat.update tier)."""
    scopes = table.get(incoming.platform, {})
    names: list[tuple[str, Rate]] = []
    for scope, rate in scopes.items():
        if scope == "edit":
            if edit:
                names.append((f"{incoming.platform}:edit:{incoming.team or '-'}", rate))
        elif scope == "bot":
            names.append((f"{incoming.platform}:bot", rate))
        elif scope == "group":
            if incoming.chat.startswith("-"):  # Telegram groups have negative ids
                names.append((f"{incoming.platform}:group:{incoming.chat}", rate))
        elif scope in ("chat", "channel"):
            names.append((f"{incoming.platform}:{scope}:{incoming.team or '-'}:"
                          f"{incoming.chat}", rate))
    return names


async def dead_letter(db: Db, incoming: Destination, text: str, *, attempts: int,
                      error: str, conversation_id: int | None = None,
                      seq: int | None = None) -> None:
    await db.execute(
        "INSERT INTO undelivered_replies (platform, chat, thread, team, conversation_id,"
        " message_seq, text, attempts, last_error) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        incoming.platform, incoming.chat, incoming.thread, incoming.team, conversation_id, seq,
        text, attempts, error[:1000])


async def deliver(db: Db, limiter: Limiter, limits: list[tuple[str, Rate]],
                  incoming: Destination, text: str, send: Send, policy: RetryPolicy, *,
                  conversation_id: int | None = None, seq: int | None = None) -> bool:
    """Send ``text``; True when the platform took it, False when it was dead-lettered.

    ``db`` records the dead letter: pass the connection the caller already holds (asking
    the pool for a second one while holding one can wait forever when the pool is full)."""
    failures = rate_limited = 0
    # A send that asks a store of its own before the platform call (the inbox fence:
    # ``FencedSend.prepare``) has it asked with the limiter's buckets, in one round trip.
    prepare: Callable[[], None] | None = getattr(send, "prepare", None)
    while True:
        try:
            if prepare is not None:
                prepare()
            if not await admit(limiter, limits) and prepare is not None:
                prepare()  # the buckets made it wait (or may have): asked again, now
            await send(text)
            return True
        except (asyncio.CancelledError, StoreOutage):
            raise
        except Exception as exc:
            wait = retry_after_of(exc)
            if wait is not None and rate_limited < policy.rate_limited_max:
                rate_limited += 1
                log.info("%s %s: platform rate limit, retrying after %.1f s",
                         incoming.platform, incoming.chat, wait)
                await asyncio.sleep(wait)
                continue
            failures += 1
            error = f"{type(exc).__name__}: {exc}"
            if failures >= policy.attempts or wait is not None or isinstance(exc, Undeliverable):
                log.error("%s %s: reply undelivered after %d attempts (%s); dead-lettered",
                          incoming.platform, incoming.chat, failures + rate_limited, error)
                await dead_letter(db, incoming, text, attempts=failures + rate_limited,
                                  error=error, conversation_id=conversation_id, seq=seq)
                return False
            delay = min(policy.backoff * 2 ** (failures - 1), policy.backoff_max)
            log.warning("%s %s: send failed (%s), retry %d in %.2f s", incoming.platform,
                        incoming.chat, error, failures, delay)
            await asyncio.sleep(delay * (0.5 + random.random() / 2))


async def admit(limiter: Limiter, limits: list[tuple[str, Rate]]) -> bool:
    """Wait for every platform bucket; an unreachable limiter store is a ``StoreOutage``.
    True when admitted by the first round trip (or no bucket), without waiting.

    Every bucket is asked at once first (one round trip): the usual case, all admitted, ends
    there. When one refuses, those that admitted are given back and the buckets are taken one
    after the other, each waited for, as if that first try had not happened (one unit per
    bucket per send either way)."""
    if not limits:
        return True
    try:
        if len(limits) > 1:
            decisions = await limiter.check_each(
                [(name, rate.rate, rate.period, rate.burst) for name, rate in limits])
            if all(decision.admitted for decision in decisions):
                return True
            for decision in decisions:
                await limiter.give_back(decision)
        for name, rate in limits:
            await limiter.acquire(name, rate=rate.rate, period=rate.period, burst=rate.burst)
        return False
    except UNREACHABLE as exc:
        raise StoreOutage(f"rate limiter: {type(exc).__name__}") from exc
