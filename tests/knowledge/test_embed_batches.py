"""The embed stage takes a batch's items at once (the handler's ``many``): one read, one
model call, one write; an item that fails makes the worker redo the batch one item per
transaction, so it alone fails."""

from __future__ import annotations

from typing import Any

from gateway.knowledge import embedding
from gateway.knowledge.stages import DEFAULTS
from gateway.pipeline.handlers import StageContext
from gateway.pipeline.stages import meta_key
from gateway.pipeline.worker import StageWorker
from tests.knowledge.indexing import leased_at_embed
from tests.pipeline.helpers import FAST

ITEMS = ("a", "b", "c", "d")


async def test_a_batch_is_embedded_in_one_model_call(runtime, monkeypatch) -> None:
    model = embedding.local()
    calls: list[int] = []
    real = type(model).embed_now

    def counted(self: Any, texts: Any) -> Any:
        calls.append(len(texts))
        return real(self, texts)

    monkeypatch.setattr(type(model), "embed_now", counted)
    worker = StageWorker(runtime, "embed", DEFAULTS["embed"], FAST)
    await worker.process(await leased_at_embed(runtime, ITEMS))
    assert calls == [8]  # 4 items x 2 chunks, one call
    assert await runtime.pg.fetchval(
        "SELECT count(*) FROM pipeline_chunks WHERE embedder = 'local:l2_supercat@256'") == 8
    assert await runtime.pg.fetchval(
        "SELECT count(*) FROM pipeline_journal WHERE stage = 'embed'") == 4


async def test_a_failing_item_of_a_batch_fails_alone(runtime) -> None:
    async def one(ctx: StageContext) -> None:
        if ctx.item_id == "c":
            raise RuntimeError("c cannot be embedded")
        await DEFAULTS["embed"](ctx)

    async def many(contexts: list[StageContext]) -> None:
        for ctx in contexts:
            await one(ctx)

    one.many = many  # type: ignore[attr-defined]
    worker = StageWorker(runtime, "embed", one, FAST)
    await worker.process(await leased_at_embed(runtime, ITEMS))
    journaled = await runtime.pg.fetch(
        "SELECT item_id FROM pipeline_journal WHERE stage = 'embed' ORDER BY item_id")
    assert [r["item_id"] for r in journaled] == ["a", "b", "d"]
    assert await runtime.pg.fetchval(
        "SELECT count(*) FROM pipeline_chunks WHERE embedder IS NOT NULL") == 6
    failures = (await runtime.durable.hget(meta_key(), "c")).split("|")[4]
    assert failures == "1"  # failed once, back for a retry; the others went on
