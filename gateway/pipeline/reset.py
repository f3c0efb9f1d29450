"""``gateway recover --reset``: rebuild the pipeline's Redis state after PostgreSQL was
restored from a backup (the runbook: maintenance on → restore → this → maintenance off).

Redis is then newer than the journal: items moved on after the backup was taken, and the
restored database no longer holds what those later stages wrote. So every live item still in
Redis goes back to the first stage its *restored* journal lacks, with its payload (kept until
the item leaves the pipeline), and its Redis position is dropped: ready lists, leases,
deadlines and delayed retries are rebuilt from nothing. An item whose journal shows it
finished is dropped from Redis; dead letters stay as they are. Then the ordinary recover
adds what only the journal knows. Nothing finished by the restored database runs again;
an item waiting for its first stage keeps its payload (its score is taken afresh).

What finished between the backup and the restore has left Redis, and the restored database
lost it: nothing holds its document any more. Reset finds those items in ADD's dedup window
(seen, but neither journaled nor in Redis), lists them, and forgets their dedup marks and
claims, so that the senders' redelivery or a resubmission is accepted, not refused as a
duplicate.

Refused unless maintenance is on, and while a worker still holds an item (a live lease:
maintenance stops new takes, but what a worker holds it finishes, or gives back, within its
grace; a lease whose holder died and whose deadline has passed does not count): rebuilding
the positions under a holder would have its COMPLETE move an item the reset put back.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass, field
from typing import Any

from gateway import keys
from gateway.config import Settings
from gateway.leases import maintenance
from gateway.pipeline import queue, shards
from gateway.pipeline.recover import BATCH, RecoverReport, print_report, recover
from gateway.pipeline.stages import (
    PRIORITY_BASE,
    SEEN_BUCKETS,
    STAGES,
    TYPE_BONUS,
    deadline_key,
    delayed_key,
    inflight_key,
    meta_key,
    ready_keys,
    seen_bucket,
)
from gateway.pipeline.status import item_metas, payload_of
from gateway.stores.runtime import open_runtime

_PRIORITY = {base: name for name, base in PRIORITY_BASE.items()}
_DOC_TYPE = {bonus: name for name, bonus in TYPE_BONUS.items()}

_JOURNAL = """
SELECT item_id, array_agg(stage) AS stages FROM pipeline_journal
WHERE item_id = ANY($1::text[]) GROUP BY item_id
"""


@dataclass
class ResetReport:
    requeued: int = 0
    finished: int = 0
    dead: int = 0
    lost: list[str] = field(default_factory=list)  # no payload and no stored document
    resubmit: list[str] = field(default_factory=list)  # finished after the backup: resend
    recovered: RecoverReport | None = None


def _fields(raw: str) -> tuple[str, str, str, str, str | None]:
    """(stage, status, priority name, doc type, payload) of a meta entry."""
    parts = raw.split("|", 7)
    stage, status, _base, bonus = parts[0], parts[1], parts[2], parts[3]
    prio = int(parts[6]) if len(parts) == 8 and parts[6].isdigit() else int(_base)
    return (stage, status, _PRIORITY.get(prio, "normal"), _DOC_TYPE.get(int(bonus), "other"),
            payload_of(raw))


class StillHeld(RuntimeError):
    """Workers hold items: the reset would rebuild the positions under them."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} item(s) still held by workers")
        self.count = count


async def held(durable: Any) -> int:
    """Items under a live lease: their deadline (Redis time, ms) has not passed."""
    seconds, micros = await durable.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    return sum([int(await durable.zcount(deadline_key(stage, tag), f"({now_ms}", "+inf"))
                for tag in shards.tags_of(durable) for stage in STAGES])


async def reset(runtime: Any, batch: int = BATCH) -> ResetReport:
    durable, report = runtime.durable, ResetReport()
    holding = await held(durable)
    if holding:
        raise StillHeld(holding)
    live: dict[str, tuple[str, str]] = {}  # item -> (its shard's tag, its meta)
    for tag in shards.tags_of(durable):
        async for item, raw in durable.hscan_iter(meta_key(tag), count=batch):
            live[item] = (tag, raw)
        positions = [key for stage in STAGES for key in (
            *ready_keys(stage, tag), inflight_key(stage, tag), deadline_key(stage, tag),
            delayed_key(stage, tag))]
        for key in positions:  # one key a command: the shards are apart on a cluster
            await durable.delete(key)
    ids = list(live)
    for start in range(0, len(ids), batch):
        chunk = ids[start:start + batch]
        journal = {r["item_id"]: set(r["stages"])
                   for r in await runtime.pg.fetch(_JOURNAL, chunk)}
        for item in chunk:
            tag, raw = live[item]
            await _rebuild(durable, item, tag, raw, journal.get(item, set()), report)
    report.recovered = await recover(runtime, batch)
    report.resubmit = await _forget_lost(runtime, batch)
    return report


async def _forget_lost(runtime: Any, batch: int) -> list[str]:
    """Items in the dedup window that neither the journal nor Redis knows: forget their
    marks and claims so that they can come in again; their ids, sorted."""
    durable, lost = runtime.durable, []
    for tag, bucket in ((t, b) for t in shards.tags_of(durable) for b in range(SEEN_BUCKETS)):
        key = seen_bucket(bucket, tag)
        seen = [item async for item, _ in durable.hscan_iter(key, count=batch)]
        for start in range(0, len(seen), batch):
            chunk = seen[start:start + batch]
            known = {r["item_id"] for r in await runtime.pg.fetch(
                "SELECT DISTINCT item_id FROM pipeline_journal WHERE item_id = ANY($1::text[])"
                " UNION SELECT item_id FROM pipeline_dead_letters"
                " WHERE item_id = ANY($1::text[])", chunk)}
            present = await item_metas(durable, chunk)
            gone = [i for i, m in zip(chunk, present, strict=True) if m is None and i not in known]
            if gone:
                await durable.hdel(key, *gone)
                await durable.delete(*(_claim_of(item) for item in gone))
                lost += gone
    return sorted(lost)


def _claim_of(item: str) -> str:
    """The inbound dedup claim behind an item id (``webhook:<source>:<id>`` or a job id)."""
    if item.startswith("webhook:"):
        source, _, delivery = item.removeprefix("webhook:").partition(":")
        return keys.dedup_webhook(source, delivery)
    return keys.dedup_job(item)


async def _rebuild(durable: Any, item: str, tag: str, raw: str, done: set[str],
                   report: ResetReport) -> None:
    _stage, status, priority, doc_type, payload = _fields(raw)
    if status == "x":
        report.dead += 1  # a dead letter: stays for the operator (requeue or purge)
        return
    await durable.hdel(meta_key(tag), item)  # (it goes back into the shard its id names)
    if "graph" in done:
        report.finished += 1
        return
    stage = next(s for s in STAGES if s not in done)
    if stage == "store" and payload is None:
        report.lost.append(item)
        return
    await queue.enqueue_at(durable, item, stage, priority=priority, doc_type=doc_type,
                           document=payload)
    report.requeued += 1


async def _main(settings: Settings, full_reset: bool) -> int:
    runtime = await open_runtime(settings, pg_max_size=2)
    try:
        if not full_reset:
            print_report(await recover(runtime))
            return 0
        if not (await maintenance.read(runtime.durable)).on:
            print("gateway recover --reset: maintenance mode is off; run `gateway "
                  "maintenance on` first (workers must hold nothing)", file=sys.stderr)
            return 1
        try:
            report = await reset(runtime)
        except StillHeld as exc:
            print(f"gateway recover --reset: {exc.count} item(s) still held by workers "
                  "(maintenance stops new takes; each holder finishes or gives back what it "
                  "holds, or its lease runs out); run it again once none is", file=sys.stderr)
            return 1
    finally:
        await runtime.close()
    print(f"reset: {report.requeued} items back at the first stage their journal lacks, "
          f"{report.finished} finished ones dropped, {report.dead} dead letters kept")
    if report.resubmit:
        print(f"finished after the backup and lost with it: {len(report.resubmit)} items; "
              f"their dedup marks are cleared, so ask their senders to resend: "
              f"{', '.join(report.resubmit[:20])}{' ...' if len(report.resubmit) > 20 else ''}")
    if report.lost:
        print(f"lost: {len(report.lost)} items had neither a payload nor a stored "
              f"document: {', '.join(report.lost[:20])}", file=sys.stderr)
    assert report.recovered is not None
    print_report(report.recovered)
    return 0


def main(args: argparse.Namespace, settings: Settings) -> int:
    """``gateway recover [--reset]``."""
    return asyncio.run(_main(settings, bool(getattr(args, "reset", False))))
