"""Enqueue into the pipeline and act on leases: thin typed wrappers over the Lua scripts.

Everything that changes queue state is one script call, so every transition is atomic and
takes its time from Redis. Over several shards (``shards.py``) ADD goes to the item's shard,
FETCH asks the shards in turn, and what follows a lease goes to the shard it names.
``add_call`` builds one ADD's keys and arguments, for callers that send it with other
commands in one round trip (the dedup intake's claim-and-enqueue).
"""

from __future__ import annotations

import enum
import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway.pipeline import metrics, shards
from gateway.pipeline.scripts import scripts_for
from gateway.pipeline.stages import (
    DEDUP_WINDOW_MS,
    EPOCH_MS,
    PRIORITY_BASE,
    RECLAIM_BASE,
    STAGES,
    TAG,
    TYPE_BONUS,
    check_stage,
    dead_key,
    deadline_key,
    delayed_key,
    held_key,
    inflight_key,
    meta_key,
    next_stage,
    quota_key,
    ready_class_key,
    ready_keys,
    seen_key,
    stats_key,
)
from gateway.stores.redis import AnyRedis

# How many entries of its dedup bucket one ADD samples for expiry, and due retries one FETCH
# promotes: bounded work per script call (a long script blocks every client of the instance).
TRIM_SAMPLE = 8
PROMOTE_BATCH = 100


class LeaseResult(enum.IntEnum):
    """Answers of HEARTBEAT / COMPLETE / FAIL."""

    OK = 1
    NOT_LEASED = -1  # nobody holds the item (reclaimed, completed or failed meanwhile)
    NOT_OWNER = -2  # another worker's token holds it: this worker is a zombie


# A script's integer answer -> LeaseResult, without the enum's call per item.
_RESULTS: dict[Any, LeaseResult] = {int(r): r for r in LeaseResult}


@dataclass(frozen=True)
class LeasedItem:
    item_id: str
    stage: str
    token: str
    worker: str
    started_ms: int
    document: dict[str, Any] | None
    base: float  # scoring base: RECLAIM_BASE once reclaimed
    bonus: float
    failures: int
    reclaims: int
    priority_base: float  # the base it was submitted with: its priority's name
    tag: str = TAG  # the hash tag of the shard it was fetched from (and lives in)


def _priority(priority: str, doc_type: str) -> tuple[int, int]:
    if priority not in PRIORITY_BASE:
        raise ValueError(f"priority must be one of {', '.join(PRIORITY_BASE)}")
    if doc_type not in TYPE_BONUS:
        raise ValueError(f"type must be one of {', '.join(TYPE_BONUS)}")
    return PRIORITY_BASE[priority], TYPE_BONUS[doc_type]


# add_call runs on every inbound request that enqueues (webhooks, /v1/jobs): everything that
# does not depend on the item is built once here, not per call.
_ENCODE = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
_PRIORITY_ARGS = {(p, t): (str(base), str(bonus))
                  for p, base in PRIORITY_BASE.items() for t, bonus in TYPE_BONUS.items()}
_ADD_KEYS = {(tag, stage, p, t): (meta_key(tag), stats_key(stage, tag),
                                  ready_class_key(stage, base - bonus, tag))
             for tag in (TAG,) for stage in STAGES for p, base in PRIORITY_BASE.items()
             for t, bonus in TYPE_BONUS.items()}
_WINDOW_ARG, _EPOCH_ARG, _TRIM_ARG = str(DEDUP_WINDOW_MS), str(EPOCH_MS), str(TRIM_SAMPLE)
_NO_QUOTA_ARGS = ("0", "0")
_NO_CLASS_ARGS = ("", "0")


class AdmissionClass(NamedTuple):
    """Counts an item in the held bytes of admission class ``name``; ADD refuses it (-4)
    when everything held would then pass ``limit`` bytes of cost (0: counted only). A
    named tuple, as ``Quota``: ``PackedAdds`` hashes both on every inbound write."""

    name: str
    limit: int


class Quota(NamedTuple):
    """What one owner may hold in the pipeline at once (0: no limit of that kind)."""

    owner: str
    items: int
    bytes: int


_NO_QUOTA_KEY = quota_key("")
_HELD_KEY = held_key()


def _shard_keys(tag: str) -> None:
    """ADD's per-shard keys of ``tag``, built once per tag on first use."""
    for stage in STAGES:
        for p, base in PRIORITY_BASE.items():
            for t, bonus in TYPE_BONUS.items():
                _ADD_KEYS[tag, stage, p, t] = (meta_key(tag), stats_key(stage, tag),
                                               ready_class_key(stage, base - bonus, tag))


def _share(limit: int, count: int) -> int:
    """One shard's part of a limit kept per shard (0: none): ``ceil(limit / count)``."""
    return -(-limit // count) if limit > 0 else 0


def add_call(item_id: str, document: dict[str, Any] | str | None, priority: str = "normal",
             doc_type: str = "other", *, stage: str = "store", force: bool = False,
             window: str = _WINDOW_ARG, quota: Quota | None = None,
             admission: AdmissionClass | None = None,
             shard_count: int = 1) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of one ADD call (validated), for ``scripts_for(client).add(...)``.
    ``window`` is the dedup window in milliseconds, as text (the inbound routes pass
    ``GATEWAY_DEDUP_TTL``'s, so the claim and ADD agree); ``quota``: refused (-3) when the
    owner's items in the pipeline would pass it; ``admission``: counted in its class's held
    bytes, refused (-4) past the class's limit. ``shard_count`` (``shards.count_of``): the
    item goes to its shard, where the quota and the class's limit are kept per shard, each
    with ``ceil(limit / shard_count)`` (docs/architecture.md, 6.1)."""
    if not item_id or not isinstance(item_id, str):
        raise ValueError("item_id must be a non-empty string")
    tag = TAG if shard_count <= 1 else shards.item_tag(item_id, shard_count)
    try:
        base, bonus = _PRIORITY_ARGS[priority, doc_type]
        if tag != TAG and (tag, stage, priority, doc_type) not in _ADD_KEYS:
            _shard_keys(tag)
        keys = [seen_key(item_id, tag), *_ADD_KEYS[tag, stage, priority, doc_type],
                quota_key(quota.owner, tag) if quota else
                _NO_QUOTA_KEY if tag == TAG else quota_key("", tag),
                _HELD_KEY if tag == TAG else held_key(tag)]
    except (KeyError, TypeError):
        _priority(priority, doc_type)  # raises the precise error
        check_stage(stage)
        raise
    if shard_count > 1:
        if quota:
            quota = Quota(quota.owner, _share(quota.items, shard_count),
                          _share(quota.bytes, shard_count))
        if admission:
            admission = AdmissionClass(admission.name, _share(admission.limit, shard_count))
    if document is None:
        payload = ""
    elif isinstance(document, str):  # the document's JSON, encoded by the caller
        payload = document
    else:
        payload = _ENCODE(document)
    args = [item_id, payload, base, bonus, window, "1" if force else "0", stage,
            _EPOCH_ARG, _TRIM_ARG, *((str(quota.items), str(quota.bytes)) if quota
                                     else _NO_QUOTA_ARGS),
            *((admission.name, str(admission.limit)) if admission else _NO_CLASS_ARGS)]
    return keys, args


def _bulk(value: str) -> bytes:
    """One RESP bulk string."""
    data = value.encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


class PackedAdds:
    """ADD, or a script that embeds it (``claim_add``), called by SHA and packed as RESP for
    ``AutoPipeline.run_packed``. All but four of a call's ~22 arguments are the same for
    every item of a kind (priority, type, quota, admission class): those are packed once per
    kind, from ``add_call``'s own keys and arguments, and a call packs only the item's seen
    bucket, the caller's extra key (the claim), the item id and the payload. Shard 0 only:
    on several shards the keys depend on the item (use ``add_call``)."""

    def __init__(self, window: str, extra_args: tuple[str, ...] = ()) -> None:
        self.window = window
        self.extra_args = extra_args
        self._parts: dict[tuple[Any, ...], tuple[bytes, bytes, bytes]] = {}

    def pack(self, sha: str, item_id: str, payload: str, extra_key: str,
             priority: str = "normal", doc_type: str = "other", quota: Quota | None = None,
             admission: AdmissionClass | None = None) -> bytes:
        """``EVALSHA sha n <ADD's keys> <extra_key> <ADD's arguments> <extra_args>``."""
        if not item_id:
            raise ValueError("item_id must be a non-empty string")
        kind = (sha, priority, doc_type, quota, admission)
        head, keys, args = self._parts.get(kind) or self._kind(kind, item_id, payload)
        seen, extra = seen_key(item_id).encode(), extra_key.encode()
        item, body = item_id.encode(), payload.encode()
        return b"%b$%d\r\n%b\r\n%b$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n%b" % (
            head, len(seen), seen, keys, len(extra), extra, len(item), item, len(body), body,
            args)

    def _kind(self, kind: tuple[Any, ...], item_id: str,
              payload: str) -> tuple[bytes, bytes, bytes]:
        sha, priority, doc_type, quota, admission = kind
        keys, args = add_call(item_id, payload, priority, doc_type, window=self.window,
                              quota=quota, admission=admission)
        # keys[0] is the item's seen bucket, args[0:2] the item and its payload: the rest
        # is the kind's.
        count = 3 + len(keys) + 1 + len(args) + len(self.extra_args)
        head = b"*%d\r\n" % count + b"".join(map(_bulk, ("EVALSHA", sha,
                                                          str(len(keys) + 1))))
        parts = (head, b"".join(map(_bulk, keys[1:])),
                 b"".join(map(_bulk, (*args[2:], *self.extra_args))))
        if len(self._parts) >= 256:  # kinds are few; quotas scale with maxmemory
            self._parts.clear()
        self._parts[kind] = parts
        return parts


async def enqueue(durable: AnyRedis, item_id: str, document: dict[str, Any], *,
                  priority: str = "normal", doc_type: str = "other") -> bool:
    """ADD into the store stage: True if newly enqueued, False if seen within 7 days."""
    keys, args = add_call(item_id, document, priority, doc_type,
                          shard_count=shards.count_of(durable))
    added = bool(await scripts_for(durable).add(keys=keys, args=args))
    if added:
        metrics.ENQUEUED.labels("store").inc()
    return added


async def enqueue_at(durable: AnyRedis, item_id: str, stage: str, *, priority: str,
                     doc_type: str, document: dict[str, Any] | str | None = None) -> bool:
    """Put an item back at ``stage`` ignoring the dedup window (recover); never duplicates an
    item still present in Redis."""
    keys, args = add_call(item_id, document, priority, doc_type, stage=stage, force=True,
                          shard_count=shards.count_of(durable))
    added = bool(await scripts_for(durable).add(keys=keys, args=args))
    if added:
        metrics.ENQUEUED.labels(stage).inc()
    return added


def fetch_call(stage: str, worker: str, token: str, lease_ms: int, count: int = 1,
               max_bytes: int = 0, tag: str = TAG) -> tuple[list[str], list[str]]:
    keys = [delayed_key(stage, tag), inflight_key(stage, tag), deadline_key(stage, tag),
            meta_key(tag), *ready_keys(stage, tag)]
    return keys, [worker, token, str(lease_ms), str(PROMOTE_BATCH), str(EPOCH_MS), str(count),
                  stage, str(max_bytes)]


async def fetch_many(durable: AnyRedis, stage: str, worker: str, lease_ms: int,
                     count: int, max_bytes: int = 0) -> list[LeasedItem]:
    """Pop up to ``count`` best items of ``stage`` under one fresh fencing token; with
    ``max_bytes``, only as many as keep their documents' bytes within it (the first item
    always), so a batch of large documents stays small.

    A FETCH retried after a lost reply may pop items under a token nobody knows; they are
    not lost, only late: RECLAIM returns them when their leases expire.

    Over shards: one shard per call, the first in ``shards.fetch_order`` that has any (the
    start moves on every call); the next shard is asked only when one is empty.
    """
    token = uuid.uuid4().hex
    script = scripts_for(durable).fetch
    for tag in shards.fetch_order(durable, stage):
        keys, args = fetch_call(stage, worker, token, lease_ms, count, max_bytes, tag)
        reply = await script(keys=keys, args=args)
        if reply:
            return _leases(reply, stage, token, worker, tag)
    return []


def _leases(reply: list[Any], stage: str, token: str, worker: str,
            tag: str) -> list[LeasedItem]:
    """FETCH's answer: its Redis time, then per item its id, "base|bonus|failures|reclaims|
    priority|" and its payload."""
    started = int(reply[0])
    leases = []
    for i in range(1, len(reply), 3):
        item, head, payload = reply[i:i + 3]
        base, bonus, failures, reclaims, priority = head.split("|", 5)[:5]
        leases.append(LeasedItem(item, stage, token, worker, started,
                                 json.loads(payload) if payload else None,
                                 float(base), float(bonus), int(failures), int(reclaims),
                                 float(priority), tag))
    return leases


async def fetch(durable: AnyRedis, stage: str, worker: str, lease_ms: int) -> LeasedItem | None:
    """Pop the best item of ``stage`` under a fresh fencing token, or None when empty."""
    leases = await fetch_many(durable, stage, worker, lease_ms, 1)
    return leases[0] if leases else None


def heartbeat_call(stage: str, item_id: str, token: str, lease_ms: int,
                   tag: str = TAG) -> tuple[list[str], list[str]]:
    return ([inflight_key(stage, tag), deadline_key(stage, tag)],
            [item_id, token, str(lease_ms)])


async def heartbeat(durable: AnyRedis, lease: LeasedItem, lease_ms: int) -> LeaseResult:
    return (await heartbeat_many(durable, [lease], lease_ms))[0]


def _heartbeat_result(reply: Any) -> LeaseResult:
    return LeaseResult.OK if isinstance(reply, str) else LeaseResult(int(reply))


async def heartbeat_many(durable: AnyRedis, leases: list[LeasedItem],
                         lease_ms: int) -> list[LeaseResult]:
    """HEARTBEAT several leases in one round trip (one script call per FETCH's batch, as
    ``complete_many``): the worker extends a whole batch every heartbeat."""
    return await _per_batch(durable, scripts_for(durable).heartbeat, leases, lambda batch: (
        heartbeat_call(batch[0].stage, batch[0].item_id, batch[0].token, lease_ms,
                       batch[0].tag)), _heartbeat_result)


async def _per_batch(durable: AnyRedis, script: Any, leases: list[LeasedItem],
                     call: Callable[[list[LeasedItem]], tuple[list[str], list[str]]],
                     result: Callable[[Any], LeaseResult]) -> list[LeaseResult]:
    """One call of ``script`` per batch of ``leases`` (same stage, token and shard):
    ``call(batch)``'s KEYS and ARGV with the batch's other items after the ARGV, several
    batches in a pipeline; each lease's answer in its place."""
    batches: dict[tuple[str, str, str], list[int]] = {}
    for i, lease in enumerate(leases):
        batches.setdefault((lease.stage, lease.token, lease.tag), []).append(i)
    calls = []
    for batch in batches.values():
        keys, args = call([leases[i] for i in batch])
        calls.append((keys, args + [leases[i].item_id for i in batch[1:]]))
    if len(calls) == 1:
        replies = [await script(keys=calls[0][0], args=calls[0][1])]
    else:
        async with durable.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                await script(keys=keys, args=args, client=pipe)
            replies = await pipe.execute()
    results: list[LeaseResult] = [LeaseResult.OK] * len(leases)
    for batch, reply in zip(batches.values(), replies, strict=True):
        answers = reply if len(batch) > 1 else [reply]
        for i, answer in zip(batch, answers, strict=True):
            results[i] = result(answer)
    return results


def complete_call(stage: str, item_id: str, token: str, cls: int | None = None,
                  tag: str = TAG) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of COMPLETE. ``cls`` = the item's ``base - bonus`` as leased: only that
    class list of the next stage is passed (fewer keys per call on the hot path); without
    it, all of them (the script finds the class by the key's suffix either way)."""
    after = next_stage(stage)
    keys = [inflight_key(stage, tag), deadline_key(stage, tag), meta_key(tag),
            stats_key(stage, tag)]
    if after:
        keys.append(stats_key(after, tag))
        keys += ready_keys(after, tag) if cls is None else [ready_class_key(after, cls, tag)]
    else:  # the item leaves the pipeline: its admission class gets its bytes back
        keys.append(held_key(tag))
    # The payload stays with the item until it leaves the pipeline, not only until its store
    # stage: after PostgreSQL is restored from a backup older than that stage, ``recover
    # --reset`` can still run the stage again (the restored database lost its document).
    args = [item_id, token, after or "", str(EPOCH_MS), "0"]
    return keys, args


def _complete_lease(lease: LeasedItem) -> tuple[list[str], list[str]]:
    # While the lease is held nothing else changes the item's base or bonus (RECLAIM does,
    # but only after taking the lease away, and then COMPLETE refuses before pushing).
    return complete_call(lease.stage, lease.item_id, lease.token,
                         int(lease.base - lease.bonus), lease.tag)


async def complete(durable: AnyRedis, lease: LeasedItem) -> LeaseResult:
    """Acknowledge the stage; the item moves to the next one (graph is final)."""
    return (await complete_many(durable, [lease]))[0]


async def complete_many(durable: AnyRedis, leases: list[LeasedItem]) -> list[LeaseResult]:
    """COMPLETE several leases in one round trip: one script call per FETCH's batch (the
    leases of one stage under one token), several batches in a pipeline."""
    return await _per_batch(durable, scripts_for(durable).complete, leases, _complete_batch,
                            lambda code: _RESULTS.get(code) or LeaseResult(int(code)))


def _complete_batch(batch: list[LeasedItem]) -> tuple[list[str], list[str]]:
    """The KEYS and ARGV of one COMPLETE call for leases of one stage and token (``_per_batch``
    adds the other items): a lone lease passes only its class's list of the next stage, a
    batch every one of them (the items' classes differ)."""
    if len(batch) == 1:
        return _complete_lease(batch[0])
    first = batch[0]
    return complete_call(first.stage, first.item_id, first.token, tag=first.tag)


async def release(durable: AnyRedis, lease: LeasedItem) -> LeaseResult:
    """Give the item back untouched (graceful shutdown): nothing is counted against it."""
    return (await release_many(durable, [lease]))[0]


def _release_call(batch: list[LeasedItem]) -> tuple[list[str], list[str]]:
    stage, tag, first = batch[0].stage, batch[0].tag, batch[0]
    return ([inflight_key(stage, tag), deadline_key(stage, tag), meta_key(tag),
             *ready_keys(stage, tag)], [first.item_id, first.token, str(EPOCH_MS)])


async def release_many(durable: AnyRedis, leases: list[LeasedItem]) -> list[LeaseResult]:
    """RELEASE several leases in one round trip (one script call per FETCH's batch)."""
    return await _per_batch(durable, scripts_for(durable).release, leases, _release_call,
                            lambda reply: _RESULTS.get(reply) or LeaseResult(int(reply)))


@dataclass(frozen=True)
class FailOutcome:
    result: LeaseResult
    dead: bool = False
    ready_at_ms: int | None = None


def fail_call(stage: str, item_id: str, token: str, reason: str, *, max_failures: int,
              backoff_ms: int, backoff_cap_ms: int, jitter: float,
              tag: str = TAG) -> tuple[list[str], list[str]]:
    keys = [inflight_key(stage, tag), deadline_key(stage, tag), delayed_key(stage, tag),
            dead_key(stage, tag), meta_key(tag), stats_key(stage, tag)]
    return keys, [item_id, token, str(max_failures), str(backoff_ms), str(backoff_cap_ms),
                  repr(jitter), reason[:500]]


async def fail(durable: AnyRedis, lease: LeasedItem, reason: str, *, max_failures: int,
               backoff_ms: int = 1000, backoff_cap_ms: int = 300_000) -> FailOutcome:
    """Retry after exponential backoff with jitter, or dead-letter after ``max_failures``."""
    keys, args = fail_call(lease.stage, lease.item_id, lease.token, reason,
                           max_failures=max_failures, backoff_ms=backoff_ms,
                           backoff_cap_ms=backoff_cap_ms, jitter=random.random(),
                           tag=lease.tag)
    reply = await scripts_for(durable).fail(keys=keys, args=args)
    if not isinstance(reply, list):
        return FailOutcome(LeaseResult(int(reply)))
    kind, when = reply
    return FailOutcome(LeaseResult.OK, dead=kind == "dead",
                       ready_at_ms=None if kind == "dead" else int(when))


async def delay(durable: AnyRedis, lease: LeasedItem, delay_ms: int) -> FailOutcome:
    """Put the item back to wait ``delay_ms`` (a spent budget): no failure is counted."""
    stage, tag = lease.stage, lease.tag
    reply = await scripts_for(durable).delay(
        keys=[inflight_key(stage, tag), deadline_key(stage, tag), delayed_key(stage, tag),
              meta_key(tag), stats_key(stage, tag)],
        args=[lease.item_id, lease.token, str(max(1, delay_ms))])
    if not isinstance(reply, list):
        return FailOutcome(LeaseResult(int(reply)))
    return FailOutcome(LeaseResult.OK, ready_at_ms=int(reply[1]))


def reclaim_call(stage: str, *, max_reclaims: int, batch: int,
                 tag: str = TAG) -> tuple[list[str], list[str]]:
    keys = [inflight_key(stage, tag), deadline_key(stage, tag), dead_key(stage, tag),
            meta_key(tag), stats_key(stage, tag), *ready_keys(stage, tag)]
    return keys, [str(batch), str(max_reclaims), str(RECLAIM_BASE), str(EPOCH_MS)]


async def reclaim(durable: AnyRedis, stage: str, *, max_reclaims: int,
                  batch: int = 100, tag: str = TAG) -> tuple[int, int, bool]:
    """One bounded RECLAIM pass of one shard: (returned to the stage, dead-lettered, more
    may be due)."""
    keys, args = reclaim_call(stage, max_reclaims=max_reclaims, batch=batch, tag=tag)
    back, dead, more = await scripts_for(durable).reclaim(keys=keys, args=args)
    return int(back), int(dead), bool(int(more))


async def reclaim_all(durable: AnyRedis, *, max_reclaims: int, batch: int = 100,
                      max_passes: int = 100) -> dict[str, tuple[int, int]]:
    """RECLAIM every stage of every shard in bounded batches until nothing more is due."""
    totals: dict[str, tuple[int, int]] = {}
    for stage in STAGES:
        back_sum = dead_sum = 0
        for tag in shards.tags_of(durable):
            for _ in range(max_passes):
                back, dead, more = await reclaim(durable, stage, max_reclaims=max_reclaims,
                                                 batch=batch, tag=tag)
                back_sum, dead_sum = back_sum + back, dead_sum + dead
                if not more:
                    break
        if back_sum or dead_sum:
            metrics.RECLAIMED.labels(stage).inc(back_sum + dead_sum)
        if dead_sum:
            metrics.DEAD_LETTERED.labels(stage).inc(dead_sum)
        totals[stage] = (back_sum, dead_sum)
    return totals


__all__ = [
    "LeaseResult",
    "LeasedItem",
    "add_call",
    "complete",
    "complete_many",
    "delay",
    "enqueue",
    "enqueue_at",
    "fail",
    "fetch",
    "fetch_many",
    "heartbeat",
    "heartbeat_many",
    "reclaim",
    "reclaim_all",
    "release",
    "release_many",
]
