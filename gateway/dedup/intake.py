"""Claim and enqueue in one round trip: the inbound path's only write.

On a single instance (or a Sentinel primary) both are one call of the ``claim_add`` script
(``gateway/pipeline/lua/claim_add.lua``): ``SET <claim> done EX ttl`` when no claim exists,
then the pipeline's ADD, atomically. The item is accepted exactly when ADD answers 1,
whoever holds the claim; on a full instance the claim is refused with the rest, so nothing
needs releasing.

On Redis Cluster the claim and ADD hash to different slots, so they go out as two commands in
one batch (one round trip per node), and the claim passes through ``in-progress``:

* claim won, ADD 1: accepted; the claim becomes ``done``.
* ADD 0: a duplicate (the item is already in the pipeline); a won claim becomes ``done``.
* claim won, ADD failed (maxmemory, lost connection, injected fault): the claim is released
  so the sender's retry is processed, and the error goes up (503 + Retry-After).
* claim lost, ADD failed: a duplicate; the claim's holder answers for the item.

Because ADD runs even behind a lost claim, a claim stuck ``in-progress`` (its release failed
along with the store) cannot swallow the retry of a delivery that was never enqueued.
"""

from __future__ import annotations

import enum
import itertools
import logging
import secrets
from typing import Any

from redis.exceptions import NoScriptError

from gateway.dedup import claims
from gateway.pipeline import metrics, shards
from gateway.pipeline.queue import AdmissionClass, PackedAdds, Quota, add_call
from gateway.pipeline.scripts import scripts_for
from gateway.stores.coalesce import AutoPipeline

log = logging.getLogger("gateway.intake")
# The add scripts' refusals (nothing written): the guard key exists; the owner's quota is
# full; the items held would pass the admission class's limit.
GUARDED, OVER_QUOTA, OVER_CLASS = -1, -3, -4
# Claim tokens only need to be unique: a random per-process prefix and a counter are.
_TOKEN_PREFIX = secrets.token_hex(6)
_counter = itertools.count(1)


class Intake(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REFUSED = "refused"  # the guard key existed: nothing was written
    OVER_QUOTA = "over_quota"  # the owner holds its quota of items or bytes: nothing written
    OVER_CLASS = "over_class"  # the pipeline holds its class's share of memory: nothing written


_REFUSALS = {OVER_QUOTA: Intake.OVER_QUOTA, OVER_CLASS: Intake.OVER_CLASS}


class Intaker:
    """Submits items for one Redis client; ``ttl`` is the dedup window, of the claims and of
    ADD alike: an id is a duplicate for ``ttl`` seconds, then a new item."""

    def __init__(self, auto: AutoPipeline, ttl: int) -> None:
        self.auto = auto
        self.ttl = ttl
        scripts = scripts_for(auto.redis)
        self._add = scripts.add
        self._claim_add = scripts.claim_add
        self._guard_add = scripts.guard_add
        self._ttl_arg = str(ttl)
        self._window_arg = str(ttl * 1000)
        self._shard_count = shards.count_of(auto.redis)
        # One script when the claim and the item share one keyspace; tests switch it off to
        # drive the cluster's two-command path on a single instance.
        self.atomic = not auto.cluster
        self._packed = (PackedAdds(self._window_arg, (self._ttl_arg,))
                        if self.atomic and self._shard_count == 1 else None)
        self._enqueued = metrics.ENQUEUED.labels("store")

    async def submit(self, claim_key: str | None, item_id: str,
                     document: dict[str, Any] | str, *,
                     priority: str = "normal", doc_type: str = "other",
                     guard: str | None = None, quota: Quota | None = None,
                     admission: AdmissionClass | None = None) -> Intake:
        """Claim ``claim_key`` (None: no claim, e.g. a job without job_id) and enqueue
        ``document`` (a dict, or its JSON already encoded), unless the key ``guard`` exists
        (then ``REFUSED``, nothing written). On a single instance the guard is read inside
        the same script; on a cluster, where it lives in another slot, by one command
        before."""
        if (self.atomic and self._packed is not None and claim_key is not None
                and guard is None and isinstance(document, str)):
            # The common case (a signed webhook, a job with an id): claim_add packed mostly
            # once per kind of item.
            packed = self._packed.pack(self._claim_add.sha, item_id, document, claim_key,
                                       priority, doc_type, quota, admission)
            return self._outcome(int(await self.auto.run_packed(self._claim_add, packed)))
        add_keys, add_args = add_call(item_id, document, priority, doc_type,
                                      window=self._window_arg, quota=quota,
                                      admission=admission, shard_count=self._shard_count)
        if self.atomic and (claim_key is not None or guard is not None):
            if claim_key is None:
                added = await self.auto.run_script(self._guard_add, [*add_keys, str(guard)],
                                                   add_args)
            else:
                script_keys = [*add_keys, claim_key] + ([guard] if guard else [])
                added = await self.auto.run_script(self._claim_add, script_keys,
                                                   [*add_args, self._ttl_arg])
        elif guard is not None and int(await self.auto.execute("EXISTS", guard)):
            added = GUARDED
        else:
            added = await self._claim_then_add(claim_key, add_keys, add_args)
        return self._outcome(int(added))

    def _outcome(self, added: int) -> Intake:
        if added == 1:
            self._enqueued.inc()
            return Intake.ACCEPTED
        if added == 0:
            return Intake.DUPLICATE
        return _REFUSALS.get(added, Intake.REFUSED)

    async def _claim_then_add(self, claim_key: str | None, add_keys: list[str],
                              add_args: list[str]) -> Any:
        """Cluster (or no claim): claim and ADD as two commands of one batch."""
        token = f"{claims.IN_PROGRESS}:{_TOKEN_PREFIX}-{next(_counter)}"
        # EVALSHA directly: a script object on a pipeline costs a SCRIPT EXISTS per flush.
        add = ("EVALSHA", self._add.sha, len(add_keys), *add_keys, *add_args)
        commands = [add] if claim_key is None else [
            ("SET", claim_key, token, "NX", "EX", self.ttl), add]
        replies = await self._batch(commands, claim_key, token)
        added = replies[-1]
        claim_reply = replies[0] if claim_key is not None else None
        won = claim_reply == "OK"
        if isinstance(added, NoScriptError):  # ADD decides alone; the claim stands as taken
            added = await _result(self.auto.run_script(self._add, add_keys, add_args))
        if isinstance(added, Exception):
            if claim_key is not None and claim_reply is None:
                return 0  # held by another delivery, which answers for it
            if won:
                await self._release(claim_key, token)
            raise added
        if int(added) < 0:  # over a quota or limit: nothing enqueued, so no claim may stay
            if won:
                await self._release(claim_key, token)
            return added
        if claim_key is not None and (won or int(added)):
            # Not awaited: if this write is lost the in-progress claim simply expires, and
            # ADD's own window keeps rejecting the item meanwhile.
            self.auto.send_nowait([("SET", claim_key, claims.DONE, "EX", self.ttl)])
        return added

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
