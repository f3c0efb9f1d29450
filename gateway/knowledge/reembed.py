"""``gateway reembed``: after ``[pipeline] embedder`` changed, run the embed stage again for
every finished item whose chunks hold another embedder's vectors (or none).

Search reads only the configured embedder's vectors, so until an item is re-embedded it is
missing from answers, never mixed into them. Each item is marked unfinished in the journal
(its ``embed`` and ``graph`` rows dropped) and enqueued at ``embed``, in one pass per batch:
if Redis loses the enqueue, ``gateway recover`` finds the item unfinished and enqueues it
again. Graph runs again after embed; its inserts are idempotent. Safe to run more than once:
an item already re-embedded is not stale, one still queued is not finished.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from typing import Any

from gateway.config import Settings
from gateway.knowledge import embedding
from gateway.pipeline import queue
from gateway.stores.runtime import open_runtime

BATCH = 500

# Finished items (a graph row) with a chunk not made by embedder $2 ("<name>@", $3 its
# length): another model's, another version's, or none at all.
_STALE = """
SELECT j.item_id FROM pipeline_journal j
WHERE j.stage = 'graph' AND j.item_id > $1
  AND EXISTS (SELECT 1 FROM pipeline_chunks c WHERE c.item_id = j.item_id
              AND (c.embedder IS NULL OR left(c.embedder, $3) <> $2))
ORDER BY j.item_id LIMIT $4
"""
_REOPEN = """
DELETE FROM pipeline_journal WHERE item_id = ANY($1::text[]) AND stage IN ('embed', 'graph')
RETURNING item_id, stage, priority, doc_type
"""


@dataclass
class ReembedReport:
    embedder: str
    requeued: int = 0
    present: int = 0  # already queued in Redis: embedded again when it gets there


async def reembed(runtime: Any, batch: int = BATCH) -> ReembedReport:
    name = embedding.configured_name(runtime.settings)
    report = ReembedReport(name)
    prefix = f"{name}@"
    after = ""
    while True:
        async with runtime.pg.acquire() as conn, conn.transaction():
            ids = [r["item_id"] for r in await conn.fetch(_STALE, after, prefix, len(prefix),
                                                           batch)]
            if not ids:
                return report
            reopened = await conn.fetch(_REOPEN, ids)
        after = ids[-1]
        for row in reopened:
            if row["stage"] != "embed":
                continue
            if await queue.enqueue_at(runtime.durable, row["item_id"], "embed",
                                      priority=row["priority"], doc_type=row["doc_type"]):
                report.requeued += 1
            else:
                report.present += 1


async def _main(settings: Settings) -> int:
    runtime = await open_runtime(settings, pg_max_size=2)
    try:
        report = await reembed(runtime)
    finally:
        await runtime.close()
    print(f"reembed ({report.embedder}): {report.requeued} items enqueued at embed, "
          f"{report.present} already queued")
    return 0


def main(args: argparse.Namespace, settings: Settings) -> int:
    """``gateway reembed``."""
    return asyncio.run(_main(settings))
