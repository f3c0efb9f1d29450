"""GET /v1/search over chunks the default stage handlers wrote: ranking, the answer cache
and its generations, parameter checks."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import REGISTRY

from gateway.knowledge import search
from gateway.knowledge.stages import chunk, embed, store
from gateway.pipeline.handlers import StageContext
from gateway.web.app import create_app


def _app(runtime) -> web.Application:
    return create_app(runtime, components=("gateway.web.health", "gateway.web.search"))


async def _index(runtime, item_id: str, text: str) -> None:
    """Run store, chunk and embed for one document, as the workers would."""
    for handler, doc in ((store, {"text": text}), (chunk, None), (embed, None)):
        async with runtime.pg.acquire() as conn, conn.transaction():
            ctx = StageContext(item_id, handler.__name__, "normal", "other", doc, conn, runtime)
            await handler(ctx)
        for callback in ctx.after_commit:
            await callback()


async def test_search_ranks_by_cosine_and_caches(runtime, make_client):
    client = await make_client(_app(runtime))
    await _index(runtime, "redis", "Redis sorted sets make priority queues with ZPOPMIN.")
    await _index(runtime, "pg", "PostgreSQL journals every stage completion in a table.")
    resp = await client.get("/v1/search", params={"q": "redis priority queues"})
    assert resp.status == 200
    body = await resp.json()
    assert body["query"] == "redis priority queues"
    assert body["results"][0]["item_id"] == "redis"
    assert set(body["results"][0]) == {"item_id", "text", "score"}
    cached = [k async for k in runtime.cache.scan_iter("cache:*")]
    assert len(cached) == 2  # generation + one answer
    assert [await runtime.cache.ttl(k) > 0 for k in cached] == [True, True]
    hits_before = _metric("hit")
    again = await (await client.get("/v1/search", params={"q": "redis priority queues"})).json()
    assert again == body and _metric("hit") == hits_before + 1


async def test_search_cache_invalidated_by_new_chunks_and_lost_generation(runtime, make_client):
    client = await make_client(_app(runtime))
    await _index(runtime, "one", "asyncio event loops")
    first = await (await client.get("/v1/search", params={"q": "asyncio loops"})).json()
    assert [r["item_id"] for r in first["results"]] == ["one"]
    await _index(runtime, "two", "asyncio event loops and tasks")
    second = await (await client.get("/v1/search", params={"q": "asyncio loops"})).json()
    assert {r["item_id"] for r in second["results"]} == {"one", "two"}
    # The generation key is evicted and a write lands meanwhile: a miss, never the old answer.
    await runtime.cache.delete(search.generation_key())
    async with runtime.pg.acquire() as conn:
        await conn.execute("DELETE FROM pipeline_chunks WHERE item_id = 'two'")
    third = await (await client.get("/v1/search", params={"q": "asyncio loops"})).json()
    assert [r["item_id"] for r in third["results"]] == ["one"]


async def test_search_rejects_bad_parameters(runtime, make_client):
    client = await make_client(_app(runtime))
    for params in ({}, {"q": " "}, {"q": "x", "limit": "0"}, {"q": "x", "limit": "abc"},
                   {"q": "x" * 501}):
        resp = await client.get("/v1/search", params=params)
        assert resp.status == 400
        assert (await resp.json())["error"] == "bad_request"


def _metric(result: str) -> float:
    return REGISTRY.get_sample_value("gateway_search_cache_total", {"result": result}) or 0.0
