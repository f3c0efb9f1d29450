"""Read-only views: one item's status (``GET /v1/jobs/{id}``) and queue depths."""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable
from typing import Any

from gateway.pipeline import metrics, shards
from gateway.pipeline.stages import (
    STAGES,
    dead_key,
    deadline_key,
    delayed_key,
    meta_key,
    ready_keys,
)
from gateway.stores.redis import AnyRedis

_STAGE_STATE = {"q": "queued", "r": "running", "w": "retrying", "x": "dead"}


def payload_of(raw: str | None) -> str | None:
    """The document JSON inside a meta field (its last part, after the priority; entries
    from before the priority field have one part less), None when absent or dropped."""
    if raw is None:
        return None
    parts = raw.split("|", 7)
    if len(parts) == 8 and parts[6].isdigit():
        return parts[7] or None
    parts = raw.split("|", 6)
    return (parts[6] or None) if len(parts) == 7 else None


async def item_meta(durable: AnyRedis, item_id: str) -> str | None:
    """An item's meta field, from the shard it is in (``shards.homes``), or None."""
    for tag in shards.homes(durable, item_id):
        raw: str | None = await durable.hget(meta_key(tag), item_id)  # type: ignore[assignment]
        if raw is not None:
            return raw
    return None


async def item_metas(durable: AnyRedis, item_ids: list[str]) -> list[str | None]:
    """``item_meta`` of many items: one HMGET per shard asked."""
    found: list[str | None] = [None] * len(item_ids)
    for round_ in (0, 1):  # the hashed shard, then shard 0 for what is still missing
        asked: dict[str, list[int]] = {}
        for index, item in enumerate(item_ids):
            places = shards.homes(durable, item)
            if found[index] is None and round_ < len(places):
                asked.setdefault(places[round_], []).append(index)
        for tag, indexes in asked.items():
            values = await durable.hmget(meta_key(tag), [item_ids[i] for i in indexes])
            for index, value in zip(indexes, values, strict=True):
                found[index] = value  # type: ignore[assignment]
    return found


async def document(durable: AnyRedis, item_id: str) -> dict[str, Any] | None:
    """The payload an item carries while in the pipeline (None when unknown)."""
    raw = await item_meta(durable, item_id)
    payload = payload_of(raw)
    return None if payload is None else dict(json.loads(payload))


def _from_meta(item_id: str, raw: str) -> dict[str, Any]:
    stage, status = raw.split("|", 2)[:2]
    here = STAGES.index(stage)
    stages = {name: ("done" if i < here else "pending") for i, name in enumerate(STAGES)}
    stages[stage] = _STAGE_STATE.get(status, "queued")
    if status == "x":
        state = "dead"
    elif here == 0 and status == "q":
        state = "queued"
    else:
        state = "running"
    return {"item_id": item_id, "state": state, "stages": stages}


def _from_journal(item_id: str, done: set[str], archived: bool) -> dict[str, Any] | None:
    if not done and not archived:
        return None
    stages = {name: ("done" if name in done else "pending") for name in STAGES}
    if len(done) == len(STAGES):
        return {"item_id": item_id, "state": "done", "stages": stages}
    first_open = next(name for name in STAGES if name not in done)
    if archived:
        stages[first_open] = "dead"
        return {"item_id": item_id, "state": "dead", "stages": stages}
    # Journaled but absent from Redis: the durable instance lost it; `gateway recover`
    # puts it back at this stage.
    stages[first_open] = "queued"
    return {"item_id": item_id, "state": "running", "stages": stages}


async def job_status(runtime: Any, item_id: str) -> dict[str, Any] | None:
    """``{"item_id", "state", "stages"}`` or None when neither Redis nor the journal knows it."""
    raw = await item_meta(runtime.durable_reads, item_id)
    if raw is not None:
        return _from_meta(item_id, raw)
    async with runtime.pg_reads.acquire() as conn:
        rows = await conn.fetch(
            "SELECT stage FROM pipeline_journal WHERE item_id = $1", item_id)
        archived = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pipeline_dead_letters WHERE item_id = $1)", item_id)
    return _from_journal(item_id, {r["stage"] for r in rows}, bool(archived))


def _entry(entry: str) -> tuple[float, str]:
    score, item = entry.split("|", 1)
    return float(score), item


def ready_order(class_lists: Iterable[list[str]]) -> list[str]:
    """Item ids of a stage's class lists ("<score>|<item>" entries, each list oldest first,
    lists in ``ready_keys`` order) in the order FETCH pops them: a merge by score, equal
    scores from the earlier list first (``heapq.merge`` is stable)."""
    merged = heapq.merge(*(map(_entry, entries) for entries in class_lists),
                         key=lambda pair: pair[0])
    return [item for _, item in merged]


async def ready_items(durable: AnyRedis, stage: str) -> list[str]:
    """Every item queued in ``stage`` on every shard, best first (reads whole lists: admin
    and tests)."""
    async with durable.pipeline(transaction=False) as pipe:
        for tag in shards.tags_of(durable):
            for key in ready_keys(stage, tag):
                pipe.lrange(key, 0, -1)
        lists = await pipe.execute()
    return ready_order(lists)


async def queue_depths(durable: AnyRedis) -> dict[str, Any]:
    """``{"stages": {stage: {"ready", "inflight", "delayed", "dead"}}}`` in one round trip,
    summed over the shards; ready = the sum of the stage's class list lengths."""
    tags = shards.tags_of(durable)
    async with durable.pipeline(transaction=False) as pipe:
        for tag in tags:
            for stage in STAGES:
                for key in ready_keys(stage, tag):
                    pipe.llen(key)
                pipe.zcard(deadline_key(stage, tag))
                pipe.zcard(delayed_key(stage, tag))
                pipe.llen(dead_key(stage, tag))
        counts = await pipe.execute()
    stages = {stage: {"ready": 0, "inflight": 0, "delayed": 0, "dead": 0} for stage in STAGES}
    width = len(ready_keys(STAGES[0])) + 3
    for i in range(len(tags) * len(STAGES)):
        row = counts[width * i: width * (i + 1)]
        sums = stages[STAGES[i % len(STAGES)]]
        for name, value in zip(("ready", "inflight", "delayed", "dead"),
                               (sum(row[:-3]), *row[-3:]), strict=True):
            sums[name] += int(value)
    return {"stages": stages}


async def refresh_depth_gauges(durable: AnyRedis) -> None:
    """Copy the queue depths into the ``gateway_pipeline_queue_depth`` gauges."""
    depths = await queue_depths(durable)
    for stage, counts in depths["stages"].items():
        for state, count in counts.items():
            metrics.DEPTH.labels(stage, state).set(count)
