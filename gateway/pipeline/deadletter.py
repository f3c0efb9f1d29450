"""Dead letters: list, requeue (back to the stage's ready set, counters reset) and purge
(archived in PostgreSQL first, then dropped from Redis); ``gateway deadletter``."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from gateway.config import Settings
from gateway.pipeline import shards
from gateway.pipeline.scripts import scripts_for
from gateway.pipeline.stages import (
    EPOCH_MS,
    check_stage,
    dead_key,
    held_key,
    meta_key,
    ready_keys,
    stats_key,
)
from gateway.pipeline.status import payload_of
from gateway.stores.redis import AnyRedis
from gateway.stores.runtime import open_runtime

MAX_BATCH = 1000


def _bounded(count: int) -> int:
    return max(0, min(count, MAX_BATCH))


async def list_dead(durable: AnyRedis, stage: str, limit: int = 100) -> list[dict[str, Any]]:
    """Oldest first (over the shards: by ``at``): ``{"item_id", "stage", "reason", "at",
    "failures", "reclaims"}``."""
    check_stage(stage)
    if not _bounded(limit):
        return []
    entries = []
    for tag in shards.tags_of(durable):
        entries += [json.loads(e) for e in
                    await durable.lrange(dead_key(stage, tag), 0, _bounded(limit) - 1)]
    if len(shards.tags_of(durable)) > 1:
        entries.sort(key=lambda entry: int(entry.get("at") or 0))
    return entries[:_bounded(limit)]


async def requeue(durable: AnyRedis, stage: str, count: int = MAX_BATCH) -> list[str]:
    """Move up to ``count`` dead letters (oldest first in each shard) back into the stage
    (each into its own shard); their ids."""
    check_stage(stage)
    ids: list[str] = []
    for tag in shards.tags_of(durable):
        if len(ids) >= _bounded(count):
            break
        ids += await scripts_for(durable).requeue(
            keys=[dead_key(stage, tag), meta_key(tag), stats_key(stage, tag),
                  *ready_keys(stage, tag)],
            args=[str(_bounded(count) - len(ids)), str(EPOCH_MS)])
    return ids


async def purge(runtime: Any, stage: str, count: int = MAX_BATCH) -> int:
    """Archive up to ``count`` dead letters into ``pipeline_dead_letters``, then drop them
    (and their payloads) from Redis. Archive first: a crash in between leaves a duplicate
    archive row at worst, never a lost dead letter. Shard by shard."""
    check_stage(stage)
    dropped = 0
    for tag in shards.tags_of(runtime.durable):
        if dropped < _bounded(count):
            dropped += await _purge_shard(runtime, stage, _bounded(count) - dropped, tag)
    return dropped


async def _purge_shard(runtime: Any, stage: str, count: int, tag: str) -> int:
    durable = runtime.durable
    entries = await durable.lrange(dead_key(stage, tag), 0, count - 1)
    if not entries:
        return 0
    parsed = [json.loads(e) for e in entries]
    payloads = [payload_of(raw) for raw in
                await durable.hmget(meta_key(tag), [p["item_id"] for p in parsed])]
    async with runtime.pg.acquire() as conn, conn.transaction():
        await conn.executemany(
            "INSERT INTO pipeline_dead_letters (item_id, stage, reason, entry, document)"
            " VALUES ($1, $2, $3, $4::jsonb, $5::jsonb)",
            [(p["item_id"], stage, p.get("reason"), p,
              json.loads(doc) if doc else None) for p, doc in zip(parsed, payloads, strict=True)])
    return int(await scripts_for(durable).purge(
        keys=[dead_key(stage, tag), meta_key(tag), held_key(tag)], args=entries))


async def _main(args: argparse.Namespace, settings: Settings) -> int:
    runtime = await open_runtime(settings, pg_max_size=2)
    try:
        if args.action == "list":
            for entry in await list_dead(runtime.durable, args.stage, args.limit):
                print(json.dumps(entry, sort_keys=True))
        elif args.action == "requeue":
            ids = await requeue(runtime.durable, args.stage, args.limit)
            print(f"requeued {len(ids)} from {args.stage}")
        else:
            dropped = await purge(runtime, args.stage, args.limit)
            print(f"purged {dropped} from {args.stage} (archived in pipeline_dead_letters)")
    finally:
        await runtime.close()
    return 0


def main(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(_main(args, settings))
