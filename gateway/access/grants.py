"""Topics an account reads through its chat links (``conversation:<id>`` of a linked chat),
for the feed, the stream and the stream's watcher.

A grant read from PostgreSQL is kept per process for ``GRANT_SECONDS``, stamped with the
account's ``bl:link:<sub>`` value at the time; removing a link writes a new random value
there (``unlinked``), so every process drops that account's grants at its next look: the
value is read at most once a second per account (coalesced), and a grant whose stamp differs
is read again. An open stream asks every 2 s (``gateway.push.web``), so it ends within 3 s of
the link's removal without a PostgreSQL query per stream per look. Only grants are kept; a
refusal is read again each time (a chat linked a moment ago is readable at once).

The mark outlives any grant stamped before it (``MARK_SECONDS`` > ``GRANT_SECONDS``): a
grant older than the removal always finds a value other than its stamp.
"""

from __future__ import annotations

import secrets
import time

import asyncpg

from gateway import keys
from gateway.access.bounded import Bounded, Fresh
from gateway.api.state import Principal
from gateway.conversations import links
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.redis import AnyRedis

GRANT_SECONDS = 60.0
MARK_SECONDS = 300
MARK_CACHE_SECONDS = 1.0
ENTRIES = 10_000
_MAX_TOPIC = 40


class LinkGrants:
    def __init__(self, pool: asyncpg.Pool, durable: AnyRedis, auto: AutoPipeline) -> None:
        self.pool = pool
        self.durable = durable
        self.auto = auto
        self._marks: Fresh[str, str | None] = Fresh(MARK_CACHE_SECONDS, ENTRIES)
        # (sub, conversation id) -> (read at, the account's mark then)
        self._granted: Bounded[tuple[str, int], tuple[float, str | None]] = Bounded(ENTRIES)

    async def _read_mark(self, sub: str) -> str | None:
        value = await self.auto.execute("GET", keys.unlinked(sub))
        return None if value is None else str(value)

    async def grant(self, principal: Principal, topics: list[str]) -> set[str]:
        """The ``conversation:<id>`` topics among ``topics`` of chats linked to the
        principal's account, where its issuer could read them itself."""
        sub = principal.account
        if sub is None:
            return set()
        ids = {int(t.split(":", 1)[1]): t for t in topics
               if t.startswith("conversation:") and t.split(":", 1)[1].isdigit()
               and len(t) < _MAX_TOPIC and principal.reads_links_to(t)}
        if not ids:
            return set()
        # Read before PostgreSQL: a removal after this changes the mark, so the grant read
        # below is dropped at a later look; one before it is seen by the query itself.
        mark = await self._marks.get(sub, lambda: self._read_mark(sub))
        now = time.monotonic()
        granted: set[str] = set()
        unknown: list[int] = []
        for conversation, topic in ids.items():
            kept = self._granted.get((sub, conversation))
            if kept is not None and now - kept[0] < GRANT_SECONDS and kept[1] == mark:
                granted.add(topic)
            else:
                unknown.append(conversation)
        if unknown:
            for conversation in await links.linked_conversations(self.pool, sub, unknown):
                self._granted.put((sub, conversation), (now, mark))
                granted.add(ids[conversation])
        return granted

    async def unlink(self, sub: str, link_id: int) -> bool:
        """Remove one of ``sub``'s links; then every process drops the account's grants."""
        if not await links.unlink(self.pool, sub, link_id):
            return False
        mark = secrets.token_hex(8)
        await self.durable.set(keys.unlinked(sub), mark, ex=MARK_SECONDS)
        self._marks.put(sub, mark)  # this process: from the next request
        return True
