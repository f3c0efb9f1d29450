"""A reply shown while it is written: a typing indicator until the first words, then one
message, edited as more text arrives, under the platform's limits.

``write_live`` reads the text deltas (a model's stream) in a task of their own and, in the
caller's task, shows the text so far whenever the platform may take an edit: at most one
edit per ``Pace.interval`` and only through the ``rl:`` limiter's buckets for edits, never an
edit to the text the message shows already (Telegram refuses that). Deltas keep arriving while
an edit waits, so each edit shows everything written until then. It returns the whole text;
the caller stores it and delivers it as the reply (the last edit, with retries and the dead
letter, through ``deliver``). A stream that fails ends in the apology (after what was
written, if anything), never in silence.

Platform adapters implement ``PlatformReply`` (post, edit, typing); the inbox's fence wraps
one into a ``LiveReply`` that remembers which message shows the reply.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, TypeGuard, runtime_checkable

from gateway.outbound.errors import retry_after_of
from gateway.ratelimit import Limiter, Rate

log = logging.getLogger("gateway.outbound")

# Characters one message can hold: Telegram 4096, Slack 40,000 (then msg_too_long),
# Mattermost 16,383 (the server's default post size).
MAX_CHARS = {"telegram": 4096, "slack": 40_000, "mattermost": 16_383}
ELLIPSIS = "…"


class PlatformReply(abc.ABC):
    """One platform's calls for one reply. Calling it sends the whole reply at once."""

    async def __call__(self, text: str) -> None:
        await self.post(text)

    async def typing(self) -> None:  # noqa: B027 - a platform without an indicator
        """Show that the bot is writing (a platform without an indicator does nothing)."""

    @abc.abstractmethod
    async def post(self, text: str, *, first: bool = True) -> str:
        """Send a new message; its platform id (what ``edit`` takes). ``first``: the reply's
        first message (a retry may find it on the platform), not a continuation."""

    @abc.abstractmethod
    async def edit(self, ref: str, text: str) -> None:
        """Replace the text of message ``ref``; showing ``text`` already is no error."""


@runtime_checkable
class LiveReply(Protocol):
    """A reply the chat sees while it is written (one message, then edits of it; a text
    longer than a message holds goes on in the next). Calling it delivers the whole text:
    edits of the messages shown so far, and new ones for what they do not hold."""

    async def __call__(self, text: str) -> None: ...
    async def typing(self) -> None: ...
    async def show(self, text: str) -> None: ...
    @property
    def editing(self) -> bool:
        """A message shows the reply already: delivering it is an edit of that message."""
        ...
    @property
    def showing(self) -> str | None:
        """The text those messages show together, as far as this process knows."""
        ...



def is_live(send: object) -> TypeGuard[LiveReply]:
    """``isinstance(send, LiveReply)``, cheap for the usual sender, a plain function: a
    runtime protocol's check walks the protocol's members on every call (20-45 µs on Python
    3.11, once per reply), and an object without ``show`` cannot pass it."""
    return hasattr(send, "show") and isinstance(send, LiveReply)

@dataclass(frozen=True)
class Pace:
    """How fast a live reply may change: the ``rl:`` buckets each edit passes, those a
    typing indicator passes (the bot's: it is no message, so it takes nothing from the
    chat's), the least time between two edits, and how often typing is renewed (a Telegram
    indicator lasts about 5 s)."""

    limiter: Limiter
    limits: list[tuple[str, Rate]]
    typing_limits: list[tuple[str, Rate]]
    interval: float = 1.0
    typing_every: float = 4.0

    async def admit(self, unless: asyncio.Event) -> bool:
        """Wait until an edit may go; False (nothing taken from a bucket still waited for)
        as soon as ``unless`` is set: the stream ended, and the last edit is the delivery's,
        which must not find the bucket spent on an edit that will not be made."""
        for name, rate in self.limits:
            while wait := await self.limiter.try_acquire(name, rate=rate.rate,
                                                         period=rate.period, burst=rate.burst):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await unless.wait()
                if unless.is_set():
                    return False
        return True

    async def try_admit_typing(self) -> bool:
        for name, rate in self.typing_limits:
            if await self.limiter.try_acquire(name, rate=rate.rate, period=rate.period,
                                              burst=rate.burst) > 0:
                return False
        return True


def fit(text: str, max_chars: int) -> str:
    """``text`` cut to what one message holds, ending in an ellipsis when cut (for a
    destination that takes one message)."""
    return text if len(text) <= max_chars else text[:max_chars - 1] + ELLIPSIS


def pieces(text: str, max_chars: int) -> list[str]:
    """``text`` as the messages it takes, each at most ``max_chars``: a full piece ends
    after its last newline, else its last space, when one is in its second half. A piece
    depends only on the text up to its end, so as a text grows its last piece grows and
    new ones follow; the pieces joined are the text."""
    parts: list[str] = []
    while len(text) > max_chars:
        window = text[:max_chars]
        cut = window.rfind("\n", max_chars // 2)
        if cut < 0:
            cut = window.rfind(" ", max_chars // 2)
        end = cut + 1 if cut >= 0 else max_chars
        parts.append(text[:end])
        text = text[end:]
    return [*parts, text]


def ending(written: str, failed: bool, apology: str) -> str:
    """The whole reply: what was written, and the apology when the stream failed."""
    if not failed:
        return written if written.strip() else apology
    return f"{written.rstrip()}\n\n{apology}" if written.strip() else apology


class _Written:
    """The text so far, filled by a reader task; the writer waits on its events."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.failed = False
        self.done = asyncio.Event()
        self.changed = asyncio.Event()

    @property
    def text(self) -> str:
        return "".join(self.parts)

    async def read(self, deltas: AsyncIterator[str]) -> None:
        try:
            async for delta in deltas:
                if delta:
                    self.parts.append(delta)
                    self.changed.set()
        except Exception as exc:
            self.failed = True
            log.warning("reply stream failed after %d characters (%s: %s); ending with an "
                        "apology", len(self.text), type(exc).__name__, exc)
        finally:
            self.done.set()
            self.changed.set()

    async def wait(self, event: asyncio.Event, timeout: float | None) -> None:
        """Until ``event`` is set or ``timeout`` passes; a ``changed`` event is then reset."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()
        if event is self.changed:
            self.changed.clear()


async def collect(deltas: AsyncIterator[str], apology: str) -> str:
    """The whole reply at once, for a destination that cannot be edited."""
    written = _Written()
    await written.read(deltas)
    return ending(written.text, written.failed, apology)


async def write_live(deltas: AsyncIterator[str], live: LiveReply, pace: Pace,
                     apology: str) -> str:
    """Show the reply while it is written; return the whole text (not yet delivered)."""
    written = _Written()
    reader = asyncio.create_task(written.read(deltas))
    try:
        await _typing_until_first_words(written, live, pace)
        await _edit_while_written(written, live, pace)
    finally:
        if not reader.done():
            reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        closing = getattr(deltas, "aclose", None)
        if closing is not None:
            with contextlib.suppress(Exception):
                await closing()
    return ending(written.text, written.failed, apology)


async def _typing_until_first_words(written: _Written, live: LiveReply, pace: Pace) -> None:
    while not written.done.is_set() and not written.text.strip():
        try:
            if await pace.try_admit_typing():  # one refused by the limits is skipped
                await live.typing()
        except Exception as exc:  # only cosmetic: never fails the reply
            log.info("typing indicator failed (%s)", type(exc).__name__)
        await written.wait(written.changed, pace.typing_every)


async def _edit_while_written(written: _Written, live: LiveReply, pace: Pace) -> None:
    """Show the text so far until the stream ends; the whole text is the caller's."""
    loop = asyncio.get_running_loop()
    shown: str | None = None
    not_before = loop.time()  # the first words show at once
    while not written.done.is_set():
        await written.wait(written.done, not_before - loop.time())
        if written.done.is_set():
            break
        # The reader goes on meanwhile, so the edit shows all written until it is admitted.
        if not await pace.admit(written.done):
            break
        text = written.text
        not_before = loop.time() + pace.interval
        if text != shown:
            try:
                await live.show(text)
                shown = text
            except Exception as exc:  # the next edit (or the final delivery) carries it
                wait = retry_after_of(exc)
                if wait is not None:
                    not_before = max(not_before, loop.time() + wait)
                log.warning("live reply: an edit failed (%s); going on",
                            type(exc).__name__)
        await written.wait(written.changed, None)
