"""``[pipeline] embedder = "<provider>:<model>"`` against the fake OpenAI-compatible server:
a job's chunks go in batches, a spent budget delays the item (never a dead letter), search
embeds the query with the same provider."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.app.worker import run_workers
from gateway.config import ConfigError
from gateway.knowledge import search, vectors
from gateway.knowledge.owners import EVERYTHING
from gateway.pipeline import queue
from gateway.pipeline.stages import dead_key, meta_key, stats_key
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app
from tests.fakes.openai import FakeOpenAI, provider_tables
from tests.fakes.pytest_plugin import OPENAI_KEY
from tests.helpers import wait_until
from tests.knowledge.indexing import index
from tests.pipeline.helpers import workers

# Seven paragraphs of ~440 characters: seven chunks (two never fit in one of 800), each
# short enough to be a query too.
TEXT = "\n\n".join(f"Paragraph {i}: " + "word " * 85 for i in range(7))


@pytest.fixture
async def provider_runtime(runtime: Runtime, fake_openai: FakeOpenAI,
                           monkeypatch: pytest.MonkeyPatch
                           ) -> AsyncIterator[Callable[..., Any]]:
    """``await make(**pipeline)`` → a runtime embedding with ``fake:emb-1``."""
    monkeypatch.setenv("FAKE_OPENAI_KEY", OPENAI_KEY)
    made: list[Runtime] = []

    async def make(budgets: dict[str, Any] | None = None, **pipeline: Any) -> Runtime:
        sections = {"providers": provider_tables(("fake", fake_openai)),
                    "pipeline": {"embedder": "fake:emb-1", **pipeline},
                    "budgets": budgets or {}}
        rt = await open_runtime(dataclasses.replace(runtime.settings, sections=sections))
        made.append(rt)
        return rt

    yield make
    for rt in made:
        await rt.close()


async def test_a_jobs_chunks_are_embedded_in_batches(provider_runtime, fake_openai,
                                                     make_client) -> None:
    rt = await provider_runtime(embed_batch=3)
    await index(rt, "doc", TEXT)
    chunks = [r["body"] for r in await rt.pg.fetch(
        "SELECT body FROM pipeline_chunks WHERE item_id = 'doc' ORDER BY seq")]
    assert len(chunks) == 7
    calls = fake_openai.calls_to("embeddings")
    assert [c.params["input"] for c in calls] == [chunks[0:3], chunks[3:6], chunks[6:]]
    assert {c.params["model"] for c in calls} == {"emb-1"}
    assert await rt.pg.fetchval(
        "SELECT array_agg(DISTINCT embedder) FROM pipeline_chunks") == ["fake:emb-1@8"]
    assert await rt.pg.fetchval(
        "SELECT count(*) FROM provider_usage WHERE job_id = 'doc'") == 3  # one row per call
    client = await make_client(create_app(rt, components=("gateway.web.search",)), rt=rt)
    resp = await client.get("/v1/search", params={"q": chunks[4], "limit": "1"})
    assert resp.status == 200
    assert (await resp.json())["results"][0]["text"] == chunks[4]
    assert fake_openai.calls_to("embeddings")[-1].params["input"] == [chunks[4]]


async def test_over_budget_the_item_waits_and_is_never_dead_lettered(
        provider_runtime, fake_openai, make_client) -> None:
    rt = await provider_runtime(budgets={"daily_tokens": 10}, budget_delay_seconds=0.1)
    await rt.pg.execute("INSERT INTO provider_usage (provider, model, kind, tokens_in,"
                        " tokens_out) VALUES ('fake', 'emb-1', 'embeddings', 10, 0)")
    assert await queue.enqueue(rt.durable, "doc", {"text": TEXT})

    async def delayed(times: int) -> bool:
        return int(await rt.durable.hget(stats_key("embed"), "delayed") or 0) >= times

    async with workers(rt):
        # More delays than the 3 failures that would dead-letter it.
        await wait_until(lambda: delayed(5), timeout=20, message="delayed 5 times")
        assert fake_openai.calls_to("embeddings") == []  # nothing was sent
        assert await rt.durable.llen(dead_key("embed")) == 0
        stage, _, _, _, failures = (await rt.durable.hget(meta_key(), "doc")).split("|")[:5]
        assert (stage, failures) == ("embed", "0")  # still at embed, no failure counted
        client = await make_client(create_app(rt, components=("gateway.web.search",)), rt=rt)
        busy = await client.get("/v1/search", params={"q": "word"})
        assert busy.status == 503 and (await busy.json())["error"] == "over_budget"
        assert int(busy.headers["Retry-After"]) > 0
        await rt.pg.execute("DELETE FROM provider_usage")  # the next day, as it were

        async def finished() -> bool:
            return bool(await rt.pg.fetchval(
                "SELECT count(*) FROM pipeline_journal WHERE stage = 'graph'"))

        await wait_until(finished, timeout=20, message="embedded once the budget allows")
    assert len(fake_openai.calls_to("embeddings")) == 1  # seven chunks, one batch of 64
    assert await rt.pg.fetchval(
        "SELECT count(*) FROM pipeline_chunks WHERE embedder = 'fake:emb-1@8'") == 7


async def test_more_dimensions_than_hnsw_takes_are_searched_without_an_index(
        runtime, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_OPENAI_KEY", OPENAI_KEY)
    async with FakeOpenAI(api_key=OPENAI_KEY, dimension=2048) as wide:
        sections = {"providers": provider_tables(("wide", wide)),
                    "pipeline": {"embedder": "wide:big"}}
        rt = await open_runtime(dataclasses.replace(runtime.settings, sections=sections))
        try:
            await index(rt, "a", "first document")
            await index(rt, "b", "second document")
            assert await rt.pg.fetchval("SELECT count(*) FROM pg_indexes WHERE indexname = $1",
                                        vectors.index_name("wide:big@2048")) == 0
            found = await search.search(rt, "second document", EVERYTHING, mode="vector")
            assert found[0]["item_id"] == "b" and found[0]["score"] > 0.999
        finally:
            await rt.close()


async def test_an_embedder_name_sql_cannot_hold_is_refused_at_start(runtime) -> None:
    settings = dataclasses.replace(runtime.settings, sections={
        "pipeline": {"embedder": "x:it's"}, "providers": {}})
    rt = await open_runtime(settings)
    try:
        with pytest.raises(ConfigError, match=r"\[pipeline\]\.embedder"):
            await run_workers(rt, asyncio.Event(), stages=("embed",))
    finally:
        await rt.close()
