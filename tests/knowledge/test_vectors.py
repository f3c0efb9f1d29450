"""Vectors and search on both layouts: pgvector with HNSW (the embedded server) and the
float8[] scan (a database migrated with ``gateway.pgvector = off``), the local model's
ranking, an embedder change, the doctor's line."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from gateway.knowledge import embedding, reembed, search, vectors
from gateway.knowledge.owners import EVERYTHING
from gateway.pipeline import queue
from gateway.stores import doctor
from tests.helpers import gateway_cli, wait_until
from tests.knowledge.indexing import index
from tests.pipeline.helpers import workers

# Each query shares words with its distractor and none (or fewer) with its target, which
# means the same thing in other words.
CORPUS = {
    "physicians": "Physicians care for people who are ill in hospitals.",
    "teacher": "A patient teacher treats a class of students kindly.",
    "washer": "Replace the worn washer to stop the faucet dripping.",
    "paint": "How to paint a kitchen wall in a weekend, in the modern style.",
    "weather": "Rain is expected tomorrow across the north of the country.",
}
LOCAL_MODEL = "local:l2_supercat@256"
QUERIES = {"a doctor treats sick patients": ("physicians", "teacher"),
           "how to fix a leaking tap in the kitchen": ("washer", "paint")}


def _overlap_best(query: str) -> str:
    words = lambda text: set(re.findall(r"\w+", text.lower()))  # noqa: E731
    return max(CORPUS, key=lambda k: len(words(query) & words(CORPUS[k]))
               / len(words(query) | words(CORPUS[k])))


@pytest.fixture(params=["pgvector", "scan"])
async def any_runtime(request, runtime, scan_runtime):  # type: ignore[no-untyped-def]
    rt = runtime if request.param == "pgvector" else scan_runtime
    if (await vectors.layout(rt)).pgvector != (request.param == "pgvector"):
        pytest.skip(f"the test database is not the {request.param} layout")
    return rt


async def test_search_ranks_the_closest_meaning_first(any_runtime) -> None:
    for item_id, text in CORPUS.items():
        await index(any_runtime, item_id, text)
    for query, (target, distractor) in QUERIES.items():
        assert _overlap_best(query) == distractor  # word overlap would pick the other
        results = await search.search(any_runtime, query, EVERYTHING, limit=3,
                                      mode="vector")
        assert results[0]["item_id"] == target, (query, results)
    model = await any_runtime.pg.fetchval("SELECT DISTINCT embedder FROM pipeline_chunks")
    assert model == LOCAL_MODEL


def _seeded(count: int, dims: int, seed: int) -> np.ndarray:
    """Clustered unit vectors (as text embeddings are), reproducible."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(count // 50, dims))
    rows = centres[rng.integers(0, len(centres), count)] + 0.6 * rng.normal(size=(count, dims))
    return embedding.normalise(rows)


async def _load(rt, model: str, rows: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    as_column = (await vectors.layout(rt)).pgvector
    await rt.pg.copy_records_to_table(
        "pipeline_chunks", columns=["item_id", "seq", "body", "embedding", "embedder", "owner"],
        records=[(f"v{i}", 0, f"row {i}", row if as_column else row.tolist(), model, "ops")
                 for i, row in enumerate(rows)])
    # Statistics of these rows, not of what an earlier test left (the planner's choice of
    # the HNSW walk depends on them, as autovacuum's would in a running database).
    await rt.pg.execute("ANALYZE pipeline_chunks")


async def test_hnsw_and_scan_agree_on_top_k(runtime, scan_runtime) -> None:
    if not (await vectors.layout(runtime)).pgvector:
        pytest.skip("the test database has no pgvector")
    model, dims, k = "test:seeded@64", 64, 10
    corpus = _seeded(3000, dims, seed=7)
    for rt in (runtime, scan_runtime):
        await _load(rt, model, corpus)
    await vectors.ensure_index(runtime, model, dims)
    plan = "\n".join(r[0] for r in await runtime.pg.fetch(
        "EXPLAIN " + vectors.nearest_sql(True, model, dims)[0], corpus[0].tolist(), k))
    assert vectors.index_name(model) in plan  # an index walk, not an exact sort
    noise = np.random.default_rng(8).normal(size=(40, dims)) / np.sqrt(dims)
    queries = embedding.normalise(corpus[:40] + 0.5 * noise)
    agreed = 0
    for query in queries:
        hnsw = await vectors.nearest(runtime, query, model, k, EVERYTHING)
        scan = await vectors.nearest(scan_runtime, query, model, k, EVERYTHING)
        assert hnsw[0]["item_id"] == scan[0]["item_id"]
        assert [round(r["score"], 4) for r in hnsw][:1] == [round(r["score"], 4)
                                                            for r in scan][:1]
        agreed += [r["item_id"] for r in hnsw] == [r["item_id"] for r in scan]
    assert agreed >= 0.95 * len(queries), f"top-{k} equal for {agreed} of {len(queries)}"
    # A walk returns at most hnsw.ef_search (40) rows unless widened for the statement.
    widest = await vectors.nearest(runtime, queries[0], model, 50, EVERYTHING)
    assert len(widest) == 50 and [r["item_id"] for r in widest[:k]] == [
        r["item_id"]
        for r in await vectors.nearest(scan_runtime, queries[0], model, k, EVERYTHING)]


async def _finished(rt, count: int) -> bool:  # type: ignore[no-untyped-def]
    done = await rt.pg.fetchval("SELECT count(*) FROM pipeline_journal WHERE stage = 'graph'")
    return bool(done == count)


async def test_another_embedders_vectors_are_not_mixed_until_reembedded(runtime,
                                                                         servers) -> None:
    for item_id in ("physicians", "weather"):
        await queue.enqueue(runtime.durable, item_id, {"text": CORPUS[item_id]})
    async with workers(runtime):
        await wait_until(lambda: _finished(runtime, 2), timeout=20, message="2 items done")
        # "weather" as an earlier embedder left it, with the query's own vector: a perfect
        # match, if vectors of two models were compared.
        query = "a doctor treats sick patients"
        vector = (await embedding.local().embed([query]))[0]
        column = (await vectors.layout(runtime)).column_type
        await runtime.pg.execute(f"UPDATE pipeline_chunks SET embedding = $1::real[]::{column}, "
                                 "embedder = 'hashing@256' WHERE item_id = 'weather'",
                                 vector.tolist())
        await search.invalidate(runtime.cache)
        found = [r["item_id"] for r in await search.search(runtime, query, EVERYTHING,
                                                                     mode="vector")]
        assert found == ["physicians"]
        lines = [c for c in await doctor.check_postgres(runtime.settings.database_url)
                 if c.status == "warn" and "2 embedders" in c.message]
        assert lines and "hashing@256: 1" in lines[0].message

        report = await reembed.reembed(runtime)
        assert (report.requeued, report.present) == (1, 0)
        await wait_until(lambda: _finished(runtime, 2), timeout=20, message="re-embedded")
    assert await runtime.pg.fetchval(
        "SELECT array_agg(DISTINCT embedder) FROM pipeline_chunks") == ["local:l2_supercat@256"]
    await search.invalidate(runtime.cache)
    assert {r["item_id"] for r in await search.search(runtime, "rain in the north",
                                                        EVERYTHING)} >= {"weather"}
    # Nothing stale is left; the operator's command says so.
    code, out, _ = await gateway_cli(servers, "reembed")
    assert code == 0 and "reembed (local:l2_supercat): 0 items enqueued at embed" in out


async def test_doctor_says_which_search(runtime, scan_runtime) -> None:
    main = {c.status: c.message for c in await doctor.check_postgres(
        runtime.settings.database_url) if c.subject == "search"}
    if (await vectors.layout(runtime)).pgvector:
        assert list(main) == ["ok"] and re.match(r"pgvector \d+\.\d+", main["ok"])
    scan = [(c.status, c.message) for c in await doctor.check_postgres(
        scan_runtime.settings.database_url) if c.subject == "search"]
    assert len(scan) == 1 and scan[0][0] == "warn" and "scans every chunk" in scan[0][1]


async def test_a_long_document_is_embedded_whole(any_runtime) -> None:
    """100 chunks: 25,600 floats in one write (more than one pgvector vector can hold)."""
    text = "\n\n".join(f"Section {i}: " + "the queue keeps its order " * 17 for i in range(100))
    await index(any_runtime, "long", text)
    counts = await any_runtime.pg.fetchrow(
        "SELECT count(*) AS chunks, count(*) FILTER (WHERE embedder IS NOT NULL) AS embedded"
        " FROM pipeline_chunks WHERE item_id = 'long'")
    assert tuple(counts) == (100, 100)


async def test_a_new_models_index_is_built_while_chunks_are_written(runtime) -> None:
    """A worker's transaction writing chunks is open when a new model's HNSW index is asked
    for: the build waits for it, and meanwhile other chunk writes go through (a plain build
    queues for a lock that stops every writer behind it); the index ends valid."""
    if not (await vectors.layout(runtime)).pgvector:
        pytest.skip("the test database has no pgvector")
    model, dims = "test:concurrent@16", 16
    name = vectors.index_name(model)
    async with runtime.pg.acquire() as open_writer, open_writer.transaction():
        await open_writer.execute(
            "INSERT INTO pipeline_chunks (item_id, seq, body, owner) VALUES ('w', 0, 'x', 'ops')")
        build = asyncio.create_task(vectors.ensure_index(runtime, model, dims))
        try:
            await wait_until(lambda: _building(runtime), timeout=10,
                             message="the build waits for the open writer")
            async with runtime.pg.acquire() as writer:
                await writer.execute("SET lock_timeout = '1s'")
                await writer.execute(  # a chunk write during the build: not held back
                    "INSERT INTO pipeline_chunks (item_id, seq, body, owner)"
                    " VALUES ('other', 0, 'y', 'ops')")
                await writer.execute("RESET lock_timeout")
        except BaseException:
            build.cancel()
            raise
    await asyncio.wait_for(build, 30)
    assert await runtime.pg.fetchval(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)", name) is True


async def _building(rt) -> bool:  # type: ignore[no-untyped-def]
    return bool(await rt.pg.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE INDEX%'"
        " AND wait_event_type = 'Lock'"))


async def test_the_embed_stage_builds_a_new_models_index_beside_its_transaction(
        runtime) -> None:
    """The local model embeds inside the stage's transaction, which a concurrent build waits
    for: the stage commits without waiting for the build, and the index follows."""
    if not (await vectors.layout(runtime)).pgvector:
        pytest.skip("the test database has no pgvector")
    vectors.forget()  # this process has not built the local model's index yet
    await runtime.pg.execute("DROP INDEX IF EXISTS " + vectors.index_name(LOCAL_MODEL))
    await asyncio.wait_for(index(runtime, "doc", "A document about queues."), 30)
    assert await wait_until(lambda: runtime.pg.fetchval(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)",
        vectors.index_name(LOCAL_MODEL)), timeout=30, message="the index built after")
