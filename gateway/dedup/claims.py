"""Dedup as a claim, not a mark.

``SET key in-progress NX EX ttl`` claims an inbound event. The owner of the claim then either
marks it ``done`` (the side effect happened) or releases it (processing failed before the side
effect, so the sender's retry must be processed). Anyone else sees a duplicate, whether the
claim is still in progress or done, and answers as for a success: Slack and Telegram must not
retry into a second answer.
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
_TAKE_OVER = (Path(__file__).parent / "lua" / "take_over.lua").read_text()


class Outcome(enum.Enum):
    CLAIMED = "claimed"
    DUPLICATE = "duplicate"


@dataclass(frozen=True)
class Claim:
    key: str
    token: str
    outcome: Outcome

    @property
    def claimed(self) -> bool:
        return self.outcome is Outcome.CLAIMED


def new_token(holder: str = "") -> str:
    """An in-progress value unique to one claim; ``holder`` (no ``:``) lets a successor tell
    whose claim it is (the Mattermost listener puts its lease's fencing token there)."""
    return f"{IN_PROGRESS}:{holder + ':' if holder else ''}{secrets.token_hex(8)}"


def holder_of(value: str | None) -> str | None:
    """The ``holder`` part of an in-progress value, if it has one."""
    if value is None or not value.startswith(IN_PROGRESS + ":"):
        return None
    parts = value.split(":")
    return parts[1] if len(parts) == 3 else None


async def claim(redis: AnyRedis, key: str, ttl: int, holder: str = "") -> Claim:
    token = new_token(holder)
    won = await redis.set(key, token, nx=True, ex=ttl)
    return Claim(key, token, Outcome.CLAIMED if won else Outcome.DUPLICATE)


async def take_over(redis: AnyRedis, key: str, seen: str, ttl: int, holder: str = "") -> Claim:
    """Replace the in-progress value ``seen`` (a dead holder's) by a claim of our own; a
    duplicate if the claim changed since it was read."""
    token = new_token(holder)
    won = await redis.eval(_TAKE_OVER, 1, key, seen, token, ttl)
    return Claim(key, token, Outcome.CLAIMED if won else Outcome.DUPLICATE)


async def mark_done(redis: AnyRedis, claim_: Claim, ttl: int) -> None:
    """The side effect happened: keep the claim for the whole window as ``done``."""
    await redis.set(claim_.key, DONE, ex=ttl)


async def release(redis: AnyRedis, claim_: Claim) -> bool:
    """Processing failed before the side effect: let the sender's retry through."""
    return bool(await redis.eval(_RELEASE, 1, claim_.key, claim_.token))


async def state(redis: AnyRedis, key: str) -> str | None:
    """``None`` (never seen or released), ``in-progress`` or ``done``."""
    value = await redis.get(key)
    if value is None:
        return None
    return DONE if value == DONE else IN_PROGRESS
