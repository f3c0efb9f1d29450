"""`gateway deadletter list|requeue|purge` and `gateway recover` as an operator runs them."""

from __future__ import annotations

import json

from gateway.pipeline import deadletter, queue
from gateway.pipeline.recover import recover
from gateway.pipeline.stages import dead_key, legacy_ready_key, ready_keys
from gateway.pipeline.status import job_status, ready_items
from tests.helpers import gateway_cli


async def _gateway(servers, *args: str, config: str | None = None) -> tuple[int, str]:
    code, out, err = await gateway_cli(servers, *args, config=config)
    return code, out + err


async def test_deadletter_commands(runtime, servers):
    for item_id in ("a", "b", "c"):
        await queue.enqueue(runtime.durable, item_id, {"text": item_id})
        lease = await queue.fetch(runtime.durable, "store", "w", 60_000)
        await queue.fail(runtime.durable, lease, f"broken {item_id}", max_failures=1)
    code, out = await _gateway(servers, "deadletter", "list", "--stage", "store")
    assert code == 0
    entries = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(e["item_id"], e["reason"]) for e in entries] == [
        ("a", "broken a"), ("b", "broken b"), ("c", "broken c")]
    code, out = await _gateway(servers, "deadletter", "requeue", "--stage", "store",
                               "--limit", "1")
    assert code == 0 and "requeued 1" in out
    assert await ready_items(runtime.durable, "store") == ["a"]
    code, out = await _gateway(servers, "deadletter", "purge", "--stage", "store")
    assert code == 0 and "purged 2" in out
    assert await runtime.durable.llen(dead_key("store")) == 0
    archived = await runtime.pg.fetch("SELECT item_id FROM pipeline_dead_letters ORDER BY id")
    assert [r["item_id"] for r in archived] == ["b", "c"]
    code, out = await _gateway(servers, "deadletter", "list", "--stage", "nope")
    assert code != 0 and "invalid choice" in out


async def test_recover_command_reports_and_requeues(runtime, servers):
    await runtime.pg.execute(
        "INSERT INTO pipeline_journal (item_id, stage, worker, priority, doc_type)"
        " VALUES ('x', 'store', 'w', 'high', 'code'), ('x', 'chunk', 'w', 'high', 'code'),"
        " ('done', 'store', 'w', 'normal', 'other'), ('done', 'chunk', 'w', 'normal', 'other'),"
        " ('done', 'embed', 'w', 'normal', 'other'), ('done', 'graph', 'w', 'normal', 'other')")
    # Journaled but absent from Redis: reported where recover will put it back.
    assert await job_status(runtime, "x") == {"item_id": "x", "state": "running", "stages": {
        "store": "done", "chunk": "done", "embed": "queued", "graph": "pending"}}
    assert (await job_status(runtime, "done"))["state"] == "done"
    assert await job_status(runtime, "never") is None
    code, out = await _gateway(servers, "recover")
    assert code == 0 and "1 re-enqueued" in out
    lease = await queue.fetch(runtime.durable, "embed", "w", 60_000)
    assert lease is not None and lease.item_id == "x" and (lease.base, lease.bonus) == (50, 3)
    assert (await job_status(runtime, "x"))["stages"] == {
        "store": "done", "chunk": "done", "embed": "running", "graph": "pending"}


async def test_recover_leaves_purged_dead_letters_purged(runtime, servers):
    """PURGE drops the item's meta; recover must not read that as "lost from Redis"."""
    await runtime.pg.execute(
        "INSERT INTO pipeline_journal (item_id, stage, worker, priority, doc_type)"
        " VALUES ('gone', 'store', 'w', 'normal', 'other'),"
        " ('kept', 'store', 'w', 'normal', 'other')")
    await queue.enqueue_at(runtime.durable, "gone", "chunk", priority="normal", doc_type="other")
    lease = await queue.fetch(runtime.durable, "chunk", "w", 60_000)
    assert lease is not None and lease.item_id == "gone"
    assert (await queue.fail(runtime.durable, lease, "broken", max_failures=1)).dead
    assert await deadletter.purge(runtime, "chunk") == 1
    report = await recover(runtime)
    assert (report.scanned, report.requeued) == (1, 1)
    assert await ready_items(runtime.durable, "chunk") == ["kept"]


async def test_worker_refuses_a_bad_handler_setting(runtime, servers, tmp_path):
    config = tmp_path / "gateway.toml"
    config.write_text('[pipeline.handlers]\nembed = "no.such.module:embed"\n')
    code, out = await _gateway(servers, "worker", config=str(config))
    assert code == 2 and "[pipeline.handlers]" in out and "no.such" in out


async def test_recover_moves_the_old_ready_sorted_set_into_the_class_lists(runtime, servers):
    """A durable instance written before the class lists keeps its queued items in one ZSET
    per stage; `gateway recover` moves them, best first, and FETCH then finds them."""
    durable = runtime.durable
    for item_id, priority in (("n", "normal"), ("c", "critical"), ("h", "high")):
        assert await queue.enqueue(durable, item_id, {"text": item_id}, priority=priority)
    await durable.delete(*ready_keys("store"))
    await durable.zadd(legacy_ready_key("store"), {"n": 100.5, "c": 10.5, "h": 50.25})
    code, out = await _gateway(servers, "recover")
    assert code == 0 and "moved 3 items" in out
    assert await durable.exists(legacy_ready_key("store")) == 0
    assert await ready_items(durable, "store") == ["c", "h", "n"]
    lease = await queue.fetch(durable, "store", "w", 60_000)
    assert lease is not None and lease.item_id == "c" and lease.document == {"text": "c"}
