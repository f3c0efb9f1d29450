"""The ``rl:`` limiter: a sliding-window log and concurrency slots, in Lua on
Redis time, shared by every process and replica that talks to redis-durable.

Why a sliding-window log and not a fixed INCR+EXPIRE window: a fixed window lets twice the
limit through around its edge. The log is exact (every half-open interval of one period holds
at most ``rate`` units) and also handles weighted costs, which token budgets need. Its memory is
one ZSET member per admitted attempt still inside the window, small for the limits we use;
a running total beside it keeps each call O(log n) (see window.lua).

A group of windows may also have a *cool-down* (``cool_down``: a provider's 429 with
``Retry-After``): a deadline in ``rl:cooldown:{<tag>}`` that the group's admission script
reads in the same call, so every caller on every replica waits it out at no extra cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from gateway import keys
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.redis import AnyRedis

log = logging.getLogger(__name__)
_HERE = Path(__file__).parent / "lua"
_CLOCK = (_HERE / "includes" / "clock.lua").read_text()
_LOG = _CLOCK + (_HERE / "includes" / "log.lua").read_text()
_SLOT = (_HERE / "includes" / "slot.lua").read_text()
_WINDOW = _LOG + (_HERE / "window.lua").read_text()
_WINDOWS = _LOG + _SLOT + (_HERE / "windows.lua").read_text()
_AMEND = _CLOCK + (_HERE / "amend.lua").read_text()
_SLOTS = _CLOCK + _SLOT + (_HERE / "slots.lua").read_text()
_COOLDOWN = _CLOCK + (_HERE / "cooldown.lua").read_text()
# amend.lua as EVAL sends it (amend_nowait): without its whole-line comments, which Redis
# would hash with the rest on every call.
_AMEND_TEXT = "\n".join(line for line in _AMEND.splitlines()
                        if line.strip() and not line.lstrip().startswith("--"))
_MICRO = 1_000_000
# Key names are built once per name and process (every call names the same few provider
# groups and platform buckets; ~1.5 µs per key, six keys and more per provider call).
KEY_CACHE = 4096


@functools.lru_cache(maxsize=KEY_CACHE)
def window_key(name: str) -> str:
    """The log of one limit; its running total is ``<key>:total`` (same hash tag)."""
    return keys.rl("window", "{" + name + "}")


@functools.lru_cache(maxsize=KEY_CACHE)
def group_key(tag: str, part: str) -> str:
    """The log of one of several limits taken together (``acquire_all``): one hash tag."""
    return keys.rl("window", "{" + tag + "}", part)


@functools.lru_cache(maxsize=KEY_CACHE)
def cooldown_key(tag: str) -> str:
    """A group's cool-down deadline (same hash tag as its logs); expires with it."""
    return keys.rl("cooldown", "{" + tag + "}")


@functools.lru_cache(maxsize=KEY_CACHE)
def group_slots_key(tag: str) -> str:
    """A group's concurrency slots (same hash tag as its logs: one script takes both)."""
    return keys.rl("slots", "{" + tag + "}")


@dataclass(frozen=True)
class Slot:
    """One of ``limit`` concurrent slots of a group, held by the attempt for the block it
    runs, at most ``lease`` seconds (a holder that crashed frees it then)."""

    limit: int
    lease: float


@dataclass(frozen=True)
class Window:
    """One limit of a group: ``limit`` units per ``period`` seconds; this attempt's ``cost``
    (0: not counted in this window)."""

    part: str
    limit: int
    period: float
    cost: int


def whole_units(rate: float, period: float) -> tuple[int, float]:
    """The log counts whole units: ``rate`` per ``period`` becomes a whole count per a window
    with the same average (0.5 per 1 s is 1 per 2 s; 1.5 per 1 s is 2 per 1.33 s)."""
    limit = math.ceil(rate)
    return limit, period * limit / rate


class LimitError(ValueError):
    """An attempt can never be admitted (its cost exceeds the limit) or the wait is too long."""


class CoolingDown(LimitError):
    """The group's cool-down lasts ``seconds`` more, longer than the caller would wait."""

    def __init__(self, tag: str, seconds: float) -> None:
        super().__init__(f"{tag}: cooling down for {seconds:.1f} s more")
        self.tag = tag
        self.seconds = seconds


@dataclass(frozen=True)
class Decision:
    """One attempt: admitted or not, how long to wait before retrying, and Redis's clock;
    ``cooling``: the wait is the group's cool-down's. A window's (``check``) also names its
    limit and the attempt: what ``give_back`` needs."""

    admitted: bool
    wait: float
    now: float
    cooling: bool = False
    slot_full: bool = False  # the wait is for one of the group's slots
    name: str = ""
    attempt: str = ""


@dataclass(frozen=True)
class _WindowCall:
    """The keys and arguments of one window.lua call, and how to read its reply."""

    name: str
    rate: float
    period: float
    burst: int
    cost: int
    now: float | None
    attempt: str = field(default_factory=lambda: secrets.token_hex(8))

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.period <= 0 or self.cost < 1 or self.burst < 1:
            raise LimitError("rate, period, burst and cost must be positive")

    @property
    def keys(self) -> list[str]:
        log_key = window_key(self.name)
        return [log_key, log_key + ":total"]

    @property
    def args(self) -> list[Any]:
        limit, period = whole_units(self.rate, self.period)
        burst = min(int(self.burst), limit)
        return [limit, round(period * _MICRO), burst, round(burst * period / limit * _MICRO),
                int(self.cost), self.attempt,
                "" if self.now is None else str(round(self.now * _MICRO))]

    def decision(self, reply: Any) -> Decision:
        admitted, wait_us, now_us = reply
        if int(admitted) < 0:
            limit, _ = whole_units(self.rate, self.period)
            raise LimitError(f"cost {self.cost} can never fit {self.name}: limit {limit}, "
                             f"burst {min(int(self.burst), limit)}")
        return Decision(int(admitted) == 1, int(wait_us) / _MICRO, int(now_us) / _MICRO,
                        name=self.name, attempt=self.attempt)


class Group:
    """The keys and fixed arguments of one group's windows.lua call (its windows' limits and
    periods, its cool-down, its slots), built once: a provider's are the same for every call
    and only the costs and the attempt change (built each time, they cost ~15 µs a call).
    The windows' own ``cost`` is not used: each call gives its costs."""

    def __init__(self, tag: str, windows: Sequence[Window], *, cooldown: bool = False,
                 slot: Slot | None = None) -> None:
        if not windows or any(w.limit < 1 or w.period <= 0 for w in windows):
            raise LimitError("limits and periods must be positive")
        self.tag = tag
        self.windows = tuple(windows)
        self.slot = slot
        self.keys: list[str] = []
        for w in windows:
            self.keys += [group_key(tag, w.part), group_key(tag, w.part) + ":total"]
        if cooldown:
            self.keys.append(cooldown_key(tag))
        self._spans = [(w.limit, round(w.period * _MICRO)) for w in windows]
        self._slot_args: list[Any] = []
        if slot is not None:
            self.keys.append(group_slots_key(tag))
            self._slot_args = [int(slot.limit), round(slot.lease * _MICRO)]
        # per window: amend.lua's keys, and with the slots' for a release
        self._amends = {w.part: ([log_key, log_key + ":total"],
                                 [log_key, log_key + ":total", group_slots_key(tag)])
                        for w, log_key in zip(windows, self.keys[:2 * len(windows):2],
                                              strict=True)}

    def args(self, costs: Sequence[int], attempt: str, now: float | None) -> list[Any]:
        """windows.lua's arguments for one attempt at ``costs`` (one per window, in order)."""
        args: list[Any] = [len(self._spans)]
        for (limit, span), cost in zip(self._spans, costs, strict=True):
            if cost < 0:
                raise LimitError("costs must not be negative")
            args += (limit, span, cost)
        args += (attempt, "" if now is None else str(round(now * _MICRO)), *self._slot_args)
        return args

    def amend_call(self, part: str, attempt: str, old: int, new: int | None, *,
                   release: bool) -> tuple[list[str], list[Any]]:
        """amend.lua's keys and arguments: ``part``'s entry of ``attempt`` from cost ``old``
        to ``new`` (None: left), and with ``release`` the attempt's slot given back."""
        keep, give_back = self._amends[part]
        args: list[Any] = [attempt, old, "" if new is None else max(0, int(new))]
        if release:
            args.append(attempt)
        return (give_back if release else keep), args


class Limiter:
    """Rate and concurrency limits by name; all state in ``rl:`` keys on redis-durable."""

    def __init__(self, redis: AnyRedis, auto: AutoPipeline | None = None) -> None:
        """``auto``: the window checks and group scripts of concurrent callers share round
        trips (and the client CPU of one command each, instead of a script call each): for
        per-request limits and provider calls."""
        self.redis = redis
        self.auto = auto
        self._window: Any = redis.register_script(_WINDOW)
        self._slots: Any = redis.register_script(_SLOTS)
        self._windows: Any = redis.register_script(_WINDOWS)
        self._amend: Any = redis.register_script(_AMEND)
        self._cooldown: Any = redis.register_script(_COOLDOWN)
        self._unawaited: set[asyncio.Future[Any]] = set()  # amend_nowait's tasks (no auto)

    async def _run(self, script: Any, script_keys: list[str], args: list[Any]) -> Any:
        if self.auto is not None:
            return await self.auto.run_script(script, script_keys, args)
        return await script(keys=script_keys, args=args)

    async def check(self, name: str, *, rate: float, period: float, burst: int = 1,
                    cost: int = 1, now: float | None = None) -> Decision:
        """One non-waiting attempt. ``now`` (seconds) drives a simulated clock in tests; left
        ``None`` the script reads Redis ``TIME``, so replicas with skewed clocks agree.

        ``burst`` smooths: at most ``burst`` units in any ``burst * period / rate`` seconds
        (``burst=1`` spaces attempts evenly; ``burst >= rate`` allows the whole window at once).
        """
        call = _WindowCall(name, rate, period, burst, cost, now)
        return call.decision(await self._run(self._window, call.keys, call.args))

    async def check_each(self, checks: Sequence[tuple[str, float, float, int]]
                         ) -> list[Decision]:
        """``check`` of several limits (name, rate, period, burst; cost 1) at once: one round
        trip through ``auto`` (each window its own script call: the limits may live in
        different cluster slots). Each decision is its own; see ``give_back``."""
        calls = [_WindowCall(name, rate, period, burst, 1, None)
                 for name, rate, period, burst in checks]
        if self.auto is None or len(calls) < 2:
            return list(await asyncio.gather(*(
                self.check(c.name, rate=c.rate, period=c.period, burst=c.burst)
                for c in calls)))
        commands = [("EVALSHA", self._window.sha, 2, *c.keys, *c.args) for c in calls]
        replies = await self.auto.batch(commands)
        if any(isinstance(reply, NoScriptError) for reply in replies):
            # The server forgot the script: load it, and send the batch again. A window that
            # ran already finds its attempt's entry and answers as before (counted once).
            await self.redis.script_load(self._window.script)
            replies = await self.auto.batch(commands)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return [call.decision(reply) for call, reply in zip(calls, replies, strict=True)]

    async def give_back(self, decision: Decision) -> None:
        """Undo an admitted ``check`` (its unit leaves the window): the other limits of the
        same send refused it, and it waits for them before taking this one again."""
        if not decision.admitted or not decision.attempt:
            return
        log_key = window_key(decision.name)
        await self._run(self._amend, [log_key, log_key + ":total"],
                        [decision.attempt, 1, 0])

    async def try_acquire(self, name: str, *, rate: float, period: float, burst: int = 1,
                          cost: int = 1) -> float:
        """Admit now and return 0.0, or admit nothing and return the seconds to wait."""
        decision = await self.check(name, rate=rate, period=period, burst=burst, cost=cost)
        return 0.0 if decision.admitted else decision.wait

    async def acquire(self, name: str, *, rate: float, period: float, burst: int = 1,
                      cost: int = 1, max_wait: float | None = None) -> None:
        """Wait (on Redis time) until admitted. ``max_wait`` bounds the total wait."""
        loop = asyncio.get_running_loop()
        deadline = None if max_wait is None else loop.time() + max_wait
        while True:
            wait = await self.try_acquire(name, rate=rate, period=period, burst=burst, cost=cost)
            if wait <= 0:
                return
            if deadline is not None and loop.time() + wait > deadline:
                raise LimitError(f"{name}: not admitted within {max_wait} s")
            await asyncio.sleep(wait)

    async def check_all(self, tag: str, windows: list[Window], *, attempt: str,
                        now: float | None = None, cooldown: bool = False,
                        slot: Slot | None = None) -> Decision:
        """Admit ``attempt`` in every window of the group at one instant, or in none;
        ``cooldown``: and not before the group's cool-down ends; ``slot``: and only while
        one of the group's concurrent slots is free, taken for ``attempt`` in the same
        call and kept while the windows refuse (given back by ``amend(..., release=True)``)."""
        return await self.check_group(Group(tag, windows, cooldown=cooldown, slot=slot),
                                      [w.cost for w in windows], attempt=attempt, now=now)

    async def check_group(self, group: Group, costs: Sequence[int], *, attempt: str,
                          now: float | None = None) -> Decision:
        """``check_all`` of a group built once, at ``costs`` (one per window, in order)."""
        admitted, wait_us, now_us, cooling, full = await self._run(
            self._windows, group.keys, group.args(costs, attempt, now))
        if int(admitted) < 0:
            raise LimitError(f"{group.tag}: a cost can never fit its limit: "
                             f"{list(zip(group.windows, costs, strict=True))}")
        return Decision(int(admitted) == 1, int(wait_us) / _MICRO, int(now_us) / _MICRO,
                        int(cooling) == 1, int(full) == 1)

    async def acquire_all(self, tag: str, windows: list[Window], *,
                          max_wait: float | None = None, cooldown: bool = False,
                          max_cooldown: float | None = None, slot: Slot | None = None,
                          poll: float = 0.05) -> str:
        """Wait (on Redis time) until admitted in every window at once; returns the attempt
        id, which ``amend`` takes to correct a cost afterwards. ``cooldown``: the group's
        cool-down is waited out too, unless more of it is left than ``max_cooldown``
        (``CoolingDown`` at once: the caller may rather go elsewhere). ``slot``: and one of
        the group's concurrent slots, taken first and held while the windows refuse, until
        ``amend(..., release=True)`` (given back here if the wait ends otherwise); a holder
        that finishes early frees its slot long before its lease ends, so a full group is
        polled every ``poll`` seconds."""
        return await self.acquire_group(Group(tag, windows, cooldown=cooldown, slot=slot),
                                        [w.cost for w in windows], max_wait=max_wait,
                                        max_cooldown=max_cooldown, poll=poll)

    async def acquire_group(self, group: Group, costs: Sequence[int], *,
                            max_wait: float | None = None, max_cooldown: float | None = None,
                            poll: float = 0.05) -> str:
        """``acquire_all`` of a group built once, at ``costs`` (one per window, in order)."""
        attempt = secrets.token_hex(8)
        loop = asyncio.get_running_loop()
        deadline = None if max_wait is None else loop.time() + max_wait
        try:
            while True:
                decision = await self.check_group(group, costs, attempt=attempt)
                if decision.admitted:
                    return attempt
                if (decision.cooling and max_cooldown is not None
                        and decision.wait > max_cooldown):
                    raise CoolingDown(group.tag, decision.wait)
                wait = min(decision.wait, poll) if decision.slot_full else decision.wait
                if deadline is not None and loop.time() + wait > deadline:
                    raise LimitError(f"{group.tag}: not admitted within {max_wait} s")
                await asyncio.sleep(wait)
        except BaseException:
            if group.slot is not None:  # a slot held while the windows refused goes back
                with contextlib.suppress(Exception):
                    await self.redis.zrem(group_slots_key(group.tag), attempt)
            raise

    async def cool_down(self, tag: str, seconds: float, *, now: float | None = None) -> None:
        """Admit nothing of the group for ``seconds`` from now (Redis time), for every
        caller of ``check_all(..., cooldown=True)``; a later deadline already set stands."""
        wait_us = round(seconds * _MICRO)
        if wait_us <= 0:
            return
        await self._cooldown(keys=[cooldown_key(tag)],
                             args=[wait_us, "" if now is None else str(round(now * _MICRO))])

    async def amend(self, tag: str, window: Window, attempt: str, cost: int | None, *,
                    release: bool = False) -> bool:
        """Set the cost of an admitted attempt in one window of its group to ``cost`` (None:
        leave it), at its admission time; False when the entry has already left the window.
        ``release``: and give back the attempt's slot of the group, in the same call."""
        return await self.amend_group(Group(tag, [window]), window.part, attempt, window.cost,
                                      cost, release=release)

    async def amend_group(self, group: Group, part: str, attempt: str, old: int,
                          new: int | None, *, release: bool = False) -> bool:
        """``amend`` in a group built once: ``part``'s entry from cost ``old`` to ``new``."""
        script_keys, args = group.amend_call(part, attempt, old, new, release=release)
        return int(await self._run(self._amend, script_keys, args)) == 1

    def amend_nowait(self, group: Group, part: str, attempt: str, old: int, new: int | None,
                     *, release: bool = False) -> None:
        """``amend`` without waiting for it: sent with the next flush of ``auto``, ahead of
        anything this process sends through it afterwards, its error logged (by ``auto``).
        As ``EVAL`` of the script's text, not by SHA: no reply is read, so a server that
        forgot the script (restart, failover) could not be answered with a load and a retry.
        Without ``auto``, a task of its own (errors logged here)."""
        script_keys, args = group.amend_call(part, attempt, old, new, release=release)
        if self.auto is not None:
            self.auto.send_nowait([("EVAL", _AMEND_TEXT, len(script_keys), *script_keys,
                                    *args)])
            return
        task = asyncio.ensure_future(self._run(self._amend, script_keys, args))
        self._unawaited.add(task)
        task.add_done_callback(functools.partial(self._amended, group.tag))

    def _amended(self, tag: str, task: asyncio.Future[Any]) -> None:
        self._unawaited.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s: amend not sent: %s", tag, task.exception())

    async def try_slot(self, name: str, holder: str, *, limit: int, lease: float,
                       now: float | None = None) -> float:
        """Take (or renew) one of ``limit`` concurrent slots; 0.0 or the seconds to wait."""
        held, wait_us = await self._slots(
            keys=[keys.rl("slots", name)],
            args=[int(limit), round(lease * _MICRO), holder,
                  "" if now is None else str(round(now * _MICRO))])
        return 0.0 if int(held) == 1 else int(wait_us) / _MICRO

    async def release_slot(self, name: str, holder: str) -> None:
        await self.redis.zrem(keys.rl("slots", name), holder)

    @contextlib.asynccontextmanager
    async def slot(self, name: str, *, limit: int, lease: float = 300.0,
                   poll: float = 0.05) -> AsyncIterator[None]:
        """Hold one of ``limit`` concurrent slots for the block. The lease frees the slot of
        a holder that crashed; a block running longer than ``lease`` loses its claim."""
        holder = secrets.token_hex(8)
        while True:
            wait = await self.try_slot(name, holder, limit=limit, lease=lease)
            if wait <= 0:
                break
            # A holder that finishes early frees its slot long before its lease ends: poll.
            await asyncio.sleep(min(wait, poll))
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await self.release_slot(name, holder)
