"""Stage names, priorities and the pipeline's key layout (all under ``q:{pipeline}:``, or
under one shard's tag each: ``shards.py``). Every key function takes the shard's ``tag``
(default ``{pipeline}``, shard 0)."""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable

from gateway import keys

FEED_TOPIC = "pipeline"  # every item's stage completions: the operators' topic


def progress_topic(owner: str) -> str:
    """``pipeline:<owner>``: the completions of one owner's items (the namespace their
    documents belong to, ``keys.document_owner``). Every credential reads its own."""
    return f"{FEED_TOPIC}:{owner}"


STAGES: tuple[str, ...] = ("store", "chunk", "embed", "graph")
# Lower score pops first.
PRIORITY_BASE = {"critical": 10, "high": 50, "normal": 100}
RECLAIM_BASE = 10
TYPE_BONUS = {"api_docs": 5, "code": 3, "other": 0}
# Fixed EPOCH of the stored score base - bonus + 0.001 * (t - EPOCH): 2026-01-01T00:00:00Z.
EPOCH_MS = 1_767_225_600_000
# ADD's window for callers that pass none (``queue.enqueue``); the inbound routes pass
# GATEWAY_DEDUP_TTL's, so the claim and ADD agree on one window.
DEDUP_WINDOW_MS = 7 * 24 * 3600 * 1000
# Buckets of the dedup window: each stays a listpack (<= 128 entries by Redis's default
# hash-max-listpack-entries) while a week holds fewer than ~128 x SEEN_BUCKETS items;
# beyond that a bucket turns into a plain hash table, larger but still correct.
SEEN_BUCKETS = 1024


def next_stage(stage: str) -> str | None:
    index = STAGES.index(stage)
    return STAGES[index + 1] if index + 1 < len(STAGES) else None


def check_stage(stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    return stage


# Pipeline-wide keys.
TAG = keys.PIPELINE_TAG


def seen_key(item_id: str, tag: str = TAG) -> str:
    """HASH item -> first-seen ms for the dedup window: one of ``SEEN_BUCKETS`` small
    hashes chosen by CRC-32 of the item id, so each stays listpack-encoded (~30 bytes an
    entry instead of ~107 in one big sorted set). ADD checks expiry against Redis TIME and
    trims a bounded sample of its bucket."""
    names = _SEEN_NAMES.get(tag) or _seen_names(tag)
    return names[zlib.crc32(item_id.encode()) % SEEN_BUCKETS]


def seen_bucket(bucket: int, tag: str = TAG) -> str:
    return keys.q("seen", bucket, tag=tag)


# tag -> the names of its seen buckets, made once per shard (every ADD names one).
_SEEN_NAMES: dict[str, list[str]] = {}


def _seen_names(tag: str) -> list[str]:
    names = _SEEN_NAMES[tag] = [seen_bucket(bucket, tag) for bucket in range(SEEN_BUCKETS)]
    return names


@functools.lru_cache(maxsize=4096)
def quota_key(owner: str, tag: str = TAG) -> str:
    """HASH item -> payload bytes of the owner's items in the pipeline, '~bytes' -> their sum
    (``owner``: a credential's namespace, ``src.<source>`` for a webhook source)."""
    return keys.q("quota", owner or "-", tag=tag)


def held_key(tag: str = TAG) -> str:
    """HASH item -> "<admission class>|<cost>" of every item accepted with a class, and the
    sums "bytes <class>" and "bytes *": what admission by class counts (ADD takes, the last
    COMPLETE and PURGE give back)."""
    return keys.q("held", tag=tag)


def meta_key(tag: str = TAG) -> str:
    """HASH item -> "stage|status|base|bonus|failures|reclaims|payload" for every item in
    flight; payload = the document JSON until the store stage has persisted it, then ''."""
    return keys.q("meta", tag=tag)


# Per-stage keys: q:{pipeline}:<kind>:<stage>.
def _per_stage(kind: str, doc: str) -> Callable[..., str]:
    def key(stage: str, tag: str = TAG) -> str:
        return keys.q(kind, stage, tag=tag)
    key.__name__ = f"{kind}_key"
    key.__doc__ = doc
    return key


# The ready set of a stage is one LIST per score class ``base - bonus`` (9 classes). Every
# script scores with Redis TIME at insertion, so within a class the stored score
# base - bonus + 0.001 * (t - EPOCH) only grows: each class is FIFO and a list (~25 bytes an
# entry) does the work of a sorted set (~110). FETCH pops the lowest of the class heads.
CLASSES: tuple[int, ...] = tuple(sorted({base - bonus for base in (*PRIORITY_BASE.values(),
                                                                   RECLAIM_BASE)
                                         for bonus in TYPE_BONUS.values()}))


def ready_class_key(stage: str, cls: int, tag: str = TAG) -> str:
    """LIST of "<score>|<item>" entries of one ``base - bonus`` class, oldest first."""
    return keys.q("ready", stage, cls, tag=tag)


def legacy_ready_key(stage: str) -> str:
    """The ZSET item -> score that held a stage's ready set before the class lists (read
    only by ``recover.upgrade_ready``)."""
    return keys.q("ready", stage)


def ready_keys(stage: str, tag: str = TAG) -> tuple[str, ...]:
    """The stage's class lists, in ``CLASSES`` order (scripts find a class by the key's
    ``:<class>`` suffix)."""
    return tuple(ready_class_key(stage, cls, tag) for cls in CLASSES)


inflight_key = _per_stage("lease", "HASH item -> token|worker|started_ms.")
deadline_key = _per_stage("deadline", "ZSET item -> lease deadline ms (RECLAIM's index).")
delayed_key = _per_stage("delayed", "ZSET item -> ms when a retry (or a delay) is due.")
dead_key = _per_stage("dead", "LIST of dead-letter JSON entries.")
stats_key = _per_stage("stats", "HASH of enqueued/completed/failed/delayed/reclaimed/dead "
                       "counters.")
