"""Offsets for rows appended without one (``feed.append_pending``), given after their
writers committed: a group commit of offsets, so writers of a busy topic never queue on a lock
held across their transactions.

One ``Sequencer`` per process. A writer calls ``sequence(topic)`` after its commit. A pass
already running may have looked at the pending rows before that commit, so the writer waits
for the next pass, which the first such waiter starts and which covers every writer that
committed before it: under load one pass numbers the rows of many transactions. Passes of one
process run one after another; passes of different processes take turns on the topic's
advisory lock in PostgreSQL (``feed_number``), each holding it for one statement and its
commit. A pass signals what it numbered after that commit, in order, so the rows of a writer
whose rows another process numbered are signalled by that process.

A pass of a topic numbers its family with it (``feed.number_pending``): the rows a writer
put on ``<topic>:...`` beside its rows on ``<topic>`` need no pass of their own, and each
family topic gets one signal per pass, for its last row (``signalled``). The statement
returns the signals' JSON as PostgreSQL built it, and the rows undecoded
(``feed.Numbered``): ``number`` (the writers' call) decodes nothing, ``sequence`` decodes the
rows for a caller that reads them.

``run_sweeper`` numbers topics with pending rows older than ``SWEEP_AGE_SECONDS`` (their
writer died between its commit and its pass, or PostgreSQL failed that pass): nothing
committed is lost, it only waits for the next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import asyncpg

from gateway.push import feed, metrics
from gateway.push.channel import publish_bodies
from gateway.push.protocol import FeedRow
from gateway.stores.postgres import leave_clean
from gateway.stores.redis import AnyRedis

log = logging.getLogger("gateway.push")

# Pending entries per topic and numbering statement (an entry is one row, or a batch's rows of
# the topic: ``payloads``); a pass repeats it until a statement makes fewer rows than this.
PASS_ROWS = 1000
SWEEP_SECONDS = 1.0
SWEEP_AGE_SECONDS = 2.0


@dataclass
class _Topic:
    asked: int = 0  # sequence() calls so far
    covered: int = 0  # calls whose commit a finished pass has seen
    running: asyncio.Task[list[feed.Numbered]] | None = None


class Sequencer:
    """Numbers and signals a topic's pending rows, one pass at a time per topic."""

    def __init__(self, pool: asyncpg.Pool, cache: AnyRedis) -> None:
        self.pool = pool
        self.cache = cache
        self._topics: dict[str, _Topic] = {}

    async def sequence(self, topic: str) -> list[FeedRow]:
        """Number (and signal) every pending row of ``topic`` committed before this call;
        returns the rows the passes it waited for numbered (others' rows included, and
        possibly not its own, when another process's pass took them). Raises when the pass
        failed: the rows stay pending for the next pass or the sweeper."""
        return [row for numbered in await self._passes(topic) for row in numbered.rows()]

    async def number(self, topic: str) -> int:
        """``sequence`` for a writer that does not read the rows: how many the passes it
        waited for numbered (no row decoded)."""
        return sum(map(len, await self._passes(topic)))

    async def _passes(self, topic: str) -> list[feed.Numbered]:
        state = self._topics.setdefault(topic, _Topic())
        state.asked += 1
        mine = state.asked
        numbered: list[feed.Numbered] = []
        while state.covered < mine:
            task = state.running
            if task is None:
                task = state.running = asyncio.create_task(self._pass(topic, state))
                task.add_done_callback(_retrieve)
            # Shielded: a cancelled writer must not cancel the pass others wait for.
            numbered += await asyncio.shield(task)
        return numbered

    async def _pass(self, topic: str, state: _Topic) -> list[feed.Numbered]:
        target = state.asked  # every call so far committed before this pass looks
        try:
            statements: list[feed.Numbered] = []
            async with self.pool.acquire() as conn:
                while True:
                    numbered = await feed.number_pending(conn, topic, PASS_ROWS)
                    statements.append(numbered)
                    if len(numbered) < PASS_ROWS:
                        break
                leave_clean(conn)  # numbering leaves no session state
            await publish_bodies(self.cache, signalled(topic, statements))
            state.covered = max(state.covered, target)
            return statements
        finally:
            state.running = None
            if state.covered == state.asked and self._topics.get(topic) is state:
                del self._topics[topic]

    async def sweep(self, older_than_seconds: float | None = None) -> int:
        """Number the topics that have rows pending longer than ``older_than_seconds``
        (default ``SWEEP_AGE_SECONDS``); returns how many rows were numbered."""
        if older_than_seconds is None:
            older_than_seconds = SWEEP_AGE_SECONDS
        numbered = 0
        async with self.pool.acquire() as conn:
            topics = await feed.pending_topics(conn, older_than_seconds)
        for topic in topics:
            numbered += await self.number(topic)
        if numbered:
            metrics.FEED_SWEPT.inc(numbered)
            log.info("numbered %d feed row(s) left pending after their writer's commit",
                     numbered)
        return numbered

    async def run_sweeper(self, stop: asyncio.Event, interval: float | None = None,
                          older_than_seconds: float | None = None) -> None:
        """``sweep`` every ``interval`` seconds (default ``SWEEP_SECONDS``) until ``stop``
        is set."""
        while not stop.is_set():
            try:
                await self.sweep(older_than_seconds)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("feed sweep failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SWEEP_SECONDS if interval is None else interval):
                    await stop.wait()


def signalled(topic: str, statements: list[feed.Numbered]) -> list[tuple[str, str]]:
    """(topic, body) of the signals a pass of ``topic`` sends: one for each of the topic's
    own rows, and one for the last row of each topic of its family. A signal says "the
    topic has offset N now"; a listener that had N - k reads the rows between from the feed
    (the hub: once for all its clients), so a family topic costs one PUBLISH per pass, not
    one per row."""
    own: list[tuple[str, str]] = []
    last: dict[str, str] = {}
    for numbered in statements:
        for signal_topic, body in numbered.signals():
            if signal_topic == topic:
                own.append((signal_topic, body))
            else:
                last[signal_topic] = body
    return own + list(last.items())


def _retrieve(task: asyncio.Task[list[feed.Numbered]]) -> None:
    """Mark a pass's failure as seen (its waiters got it, or were cancelled)."""
    if not task.cancelled():
        task.exception()
