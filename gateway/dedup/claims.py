"""Dedup as a claim, not a mark.

``SET key in-progress NX EX ttl`` claims an inbound event. The owner of the claim then either
marks it ``done`` (the side effect happened) or releases it (processing failed before the side
effect, so the sender's retry must be processed). Anyone else learns which of the two it
met: a ``done`` claim is a duplicate, answered as a success (Slack and Telegram must not retry
into a second answer); a claim still ``in-progress`` is an attempt that may yet fail and be
released, so its retry is told to come back later (503 + ``Retry-After``), never "done".
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from pathlib import Path

from gateway.stores.redis import AnyRedis

IN_PROGRESS = "in-progress"
DONE = "done"

# Release only our own claim: a claim that expired and was re-taken by a retry is not ours.
_RELEASE = (Path(__file__).parent / "lua" / "release.lua").read_text()


class Outcome(enum.Enum):
    CLAIMED = "claimed"
    DUPLICATE = "duplicate"  # the claim is done: the side effect happened
    IN_PROGRESS = "in-progress"  # another attempt holds it and may still fail


@dataclass(frozen=True)
class Claim:
    key: str
    token: str
    outcome: Outcome

    @property
    def claimed(self) -> bool:
        return self.outcome is Outcome.CLAIMED


def new_token() -> str:
    """An in-progress value unique to one claim (release compares it)."""
    return f"{IN_PROGRESS}:{secrets.token_hex(8)}"


async def claim(redis: AnyRedis, key: str, ttl: int) -> Claim:
    """Take ``key``, or say in what state another attempt holds it (one command:
    ``SET NX GET`` answers the value it found, nil when it set ours)."""
    token = new_token()
    held = await redis.set(key, token, nx=True, ex=ttl, get=True)
    if held is None:
        return Claim(key, token, Outcome.CLAIMED)
    return Claim(key, token, Outcome.DUPLICATE if held == DONE else Outcome.IN_PROGRESS)


async def mark_done(redis: AnyRedis, claim_: Claim, ttl: int) -> None:
    """The side effect happened: keep the claim for the whole window as ``done``."""
    await redis.set(claim_.key, DONE, ex=ttl)


async def release(redis: AnyRedis, claim_: Claim) -> bool:
    """Processing failed before the side effect: let the sender's retry through."""
    return bool(await redis.eval(_RELEASE, 1, claim_.key, claim_.token))


def release_command(claim_: Claim) -> tuple[str, str, int, str, str]:
    """``release`` as one command, for a caller that cannot wait for the store (its request's
    budget ran out) and sends it without awaiting the reply."""
    return ("EVAL", _RELEASE, 1, claim_.key, claim_.token)


async def state(redis: AnyRedis, key: str) -> str | None:
    """``None`` (never seen or released), ``in-progress`` or ``done``."""
    value = await redis.get(key)
    if value is None:
        return None
    return DONE if value == DONE else IN_PROGRESS
