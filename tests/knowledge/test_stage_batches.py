"""The default store, chunk and graph handlers take a leased batch in set-based statements:
each document of the batch gets exactly the rows it would get alone, and a bad document in a
batch fails alone (the worker redoes the batch one item per transaction)."""

from __future__ import annotations

from gateway.knowledge.stages import DEFAULTS, extract_edges, split_text
from gateway.pipeline import queue
from gateway.pipeline.stages import dead_key
from gateway.pipeline.worker import StageWorker, WorkerConfig
from gateway.stores.runtime import Runtime

TEXTS = {
    "a": "See https://a.test/x and @alice. #one #two",
    "b": ("First paragraph about queues, long enough. " * 30 + "\n\n"
          + "Second one with @bob and https://b.test/y. " * 25),
    "c": "Nothing to link here.",
}


async def _stage(runtime: Runtime, stage: str, count: int) -> list[str]:
    """Lease up to ``count`` items of ``stage`` at once and run them as one batch; the ids
    leased together."""
    leases = await queue.fetch_many(runtime.durable, stage, "w", 60_000, count)
    await StageWorker(runtime, stage, DEFAULTS[stage], WorkerConfig(max_failures=1),
                      name="w").process(leases)
    return sorted(lease.item_id for lease in leases)


async def test_a_batch_gets_each_documents_own_rows_and_a_bad_one_fails_alone(
        runtime: Runtime) -> None:
    for item_id, text in TEXTS.items():
        await queue.enqueue(runtime.durable, item_id, {"text": text, "title": item_id.upper()})
    await queue.enqueue(runtime.durable, "bad", {"title": "no text"})

    assert await _stage(runtime, "store", 8) == ["a", "b", "bad", "c"]
    assert await runtime.durable.llen(dead_key("store")) == 1
    stored = await runtime.pg.fetch(
        "SELECT item_id, title, body, document FROM pipeline_documents ORDER BY item_id")
    assert [(r["item_id"], r["title"], r["body"]) for r in stored] == [
        (k, k.upper(), v) for k, v in sorted(TEXTS.items())]
    assert stored[0]["document"] == {"text": TEXTS["a"], "title": "A"}

    assert await _stage(runtime, "chunk", 8) == ["a", "b", "c"]
    for item_id, text in TEXTS.items():
        rows = await runtime.pg.fetch(
            "SELECT seq, body FROM pipeline_chunks WHERE item_id = $1 ORDER BY seq", item_id)
        assert [(r["seq"], r["body"]) for r in rows] == list(enumerate(split_text(text)))
    assert len(split_text(TEXTS["b"])) > 1

    assert await _stage(runtime, "embed", 8) == ["a", "b", "c"]
    assert await _stage(runtime, "graph", 8) == ["a", "b", "c"]
    for item_id, text in TEXTS.items():
        rows = await runtime.pg.fetch(
            "SELECT kind, target FROM pipeline_edges WHERE item_id = $1", item_id)
        assert sorted((r["kind"], r["target"]) for r in rows) == sorted(extract_edges(text))
    assert await runtime.pg.fetchval(
        "SELECT count(*) FROM pipeline_journal WHERE stage = 'graph'") == 3
