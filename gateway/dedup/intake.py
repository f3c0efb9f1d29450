"""Claim and enqueue in one round trip: the inbound path's only write.

One batch on the shared ``AutoPipeline`` carries ``SET <claim> in-progress NX EX ttl`` and the
pipeline's ADD script for the item. ADD is itself idempotent per item id (its 7-day seen
window), so the item is accepted exactly when ADD answers 1, whoever holds the claim:

* claim won, ADD 1: accepted; the claim becomes ``done``.
* ADD 0: a duplicate (the item is already in the pipeline); a won claim becomes ``done``.
* claim won, ADD failed (maxmemory, lost connection, injected fault): the claim is released
  so the sender's retry is processed, and the error goes up (503 + Retry-After).
* claim lost, ADD failed: a duplicate; the claim's holder answers for the item.

Because ADD runs even behind a lost claim, a claim stuck ``in-progress`` (its release failed
along with the store) cannot swallow the retry of a delivery that was never enqueued. On
Redis Cluster the claim and ADD hash to different slots; the ``AutoPipeline`` then sends each
batch as a cluster pipeline (one round trip per node) instead of coalescing requests.
"""

from __future__ import annotations

import enum
import itertools
import logging
import secrets
from typing import Any

from redis.exceptions import NoScriptError

from gateway.dedup import claims
from gateway.dedup.autopipeline import AutoPipeline
from gateway.pipeline import metrics
from gateway.pipeline.queue import add_call
from gateway.pipeline.scripts import scripts_for

log = logging.getLogger("gateway.intake")
# Claim tokens only need to be unique: a random per-process prefix and a counter are.
_TOKEN_PREFIX = secrets.token_hex(6)
_counter = itertools.count(1)


class Intake(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"


class Intaker:
    """Submits items for one Redis client; ``ttl`` is the dedup window of the claims."""

    def __init__(self, auto: AutoPipeline, ttl: int) -> None:
        self.auto = auto
        self.ttl = ttl
        self._add = scripts_for(auto.redis).add
        self._enqueued = metrics.ENQUEUED.labels("store")

    async def submit(self, claim_key: str | None, item_id: str, document: dict[str, Any], *,
                     priority: str = "normal", doc_type: str = "other") -> Intake:
        """Claim ``claim_key`` (None: no claim, e.g. a job without job_id) and enqueue."""
        add_keys, add_args = add_call(item_id, document, priority, doc_type)
        token = f"{claims.IN_PROGRESS}:{_TOKEN_PREFIX}-{next(_counter)}"

        # EVALSHA directly: a script object on a pipeline costs a SCRIPT EXISTS per flush.
        add = ("EVALSHA", self._add.sha, len(add_keys), *add_keys, *add_args)
        commands = [add] if claim_key is None else [
            ("SET", claim_key, token, "NX", "EX", self.ttl), add]
        replies = await self._batch(commands, claim_key, token)
        added = replies[-1]
        claim_reply = replies[0] if claim_key is not None else None
        won = claim_reply == "OK"
        if isinstance(added, NoScriptError):  # script cache flushed (restart, failover)
            added = await _result(self._add(keys=add_keys, args=add_args))
        if isinstance(added, Exception):
            if claim_key is not None and claim_reply is None:
                return Intake.DUPLICATE  # held by another delivery, which answers for it
            if won:
                await self._release(claim_key, token)
            raise added
        if claim_key is not None and (won or int(added)):
            # Not awaited: if this write is lost the in-progress claim simply expires, and
            # ADD's own window keeps rejecting the item meanwhile.
            self.auto.send_nowait([("SET", claim_key, claims.DONE, "EX", self.ttl)])
        if int(added):
            self._enqueued.inc()
            return Intake.ACCEPTED
        return Intake.DUPLICATE

    async def _batch(self, commands: list[Any], claim_key: str | None,
                     token: str) -> list[Any]:
        try:
            return await self.auto.batch(commands)
        except Exception:
            # The round trip failed: whether the claim was taken is unknown; drop it if so.
            await self._release(claim_key, token)
            raise

    async def _release(self, claim_key: str | None, token: str) -> None:
        if claim_key is None:
            return
        try:
            await claims.release(self.auto.redis,
                                 claims.Claim(claim_key, token, claims.Outcome.CLAIMED))
        except Exception as exc:  # the store is down: the claim expires, ADD still decides
            log.warning("could not release %s: %s", claim_key, type(exc).__name__)


async def _result(call: Any) -> Any:
    """The awaited value, or the exception as a value (like a pipeline reply)."""
    try:
        return await call
    except Exception as exc:
        return exc
