"""``gateway recover``: re-enqueue from the PostgreSQL run journal every item that has not
finished the pipeline and is not present in Redis (e.g. after the durable instance was
wiped), unless its dead letter was purged since. Each goes back at the first stage its
journal lacks, with its journaled priority.

Safe to run at any time and more than once: ADD with ``force`` never duplicates an item still
present in Redis, and a stage whose journal row already exists is acknowledged without
running its handler again.

Items whose store stage never completed had their payload only in Redis; they cannot be
rebuilt from PostgreSQL (AOF ``everysec`` is what protects them across restarts).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gateway.pipeline import queue
from gateway.pipeline.scripts import scripts_for
from gateway.pipeline.stages import STAGES, legacy_ready_key, meta_key, ready_keys
from gateway.pipeline.status import item_metas
from gateway.stores.redis import AnyRedis

log = logging.getLogger("gateway.pipeline")
BATCH = 500

# Unfinished: journaled, no graph row, and not purged since its last completion (a purged
# dead letter was dropped on purpose; recovering it would undo the operator's decision).
_UNFINISHED = """
SELECT j.item_id, array_agg(j.stage) AS stages, min(j.priority) AS priority,
       min(j.doc_type) AS doc_type
FROM pipeline_journal j WHERE j.item_id > $1
GROUP BY j.item_id
HAVING NOT bool_or(j.stage = 'graph')
   AND NOT EXISTS (SELECT 1 FROM pipeline_dead_letters d
                   WHERE d.item_id = j.item_id AND d.archived_at >= max(j.completed_at))
ORDER BY j.item_id LIMIT $2
"""


@dataclass
class RecoverReport:
    scanned: int = 0
    present: int = 0
    requeued: int = 0
    upgraded: int = 0


async def upgrade_ready(durable: AnyRedis, batch: int = BATCH) -> int:
    """Move items still queued in the ready ZSETs of the earlier layout into the class lists
    (bounded batches, best first, scores kept); how many moved. Without this they would sit
    where no FETCH looks, and recover would not re-enqueue them (their meta is present)."""
    moved = 0
    upgrade = scripts_for(durable).upgrade
    for stage in STAGES:
        left = 1
        while left:
            done, left = await upgrade(keys=[legacy_ready_key(stage), meta_key(),
                                             *ready_keys(stage)], args=[str(batch)])
            moved += int(done)
    return moved


async def recover(runtime: Any, batch: int = BATCH) -> RecoverReport:
    report = RecoverReport(upgraded=await upgrade_ready(runtime.durable, batch))
    after = ""
    while True:
        rows = await runtime.pg.fetch(_UNFINISHED, after, batch)
        if not rows:
            return report
        after = rows[-1]["item_id"]
        ids = [r["item_id"] for r in rows]
        present = await item_metas(runtime.durable, ids)
        report.scanned += len(rows)
        for row, meta in zip(rows, present, strict=True):
            if meta is not None:
                report.present += 1
                continue
            done = set(row["stages"])
            stage = next(s for s in STAGES if s not in done)
            if await queue.enqueue_at(runtime.durable, row["item_id"], stage,
                                      priority=row["priority"], doc_type=row["doc_type"]):
                report.requeued += 1
            else:
                report.present += 1


def print_report(report: RecoverReport) -> None:
    print(f"scanned {report.scanned} unfinished items: {report.requeued} re-enqueued, "
          f"{report.present} still in Redis")
    if report.upgraded:
        print(f"moved {report.upgraded} items from the old ready sorted sets to the class lists")
