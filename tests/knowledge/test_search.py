"""GET /v1/search over chunks the default stage handlers wrote: ranking, the answer cache
and its generations, parameter checks."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import asyncpg
from aiohttp import web
from prometheus_client import REGISTRY

from gateway.knowledge import search
from gateway.push import feed
from gateway.stores.runtime import open_runtime
from gateway.web.app import create_app
from tests.helpers import wait_until
from tests.knowledge.indexing import index as _index


def _app(runtime) -> web.Application:
    return create_app(runtime, components=("gateway.web.health", "gateway.web.search"))


async def test_search_ranks_by_cosine_and_caches(runtime, make_client):
    client = await make_client(_app(runtime))
    await _index(runtime, "redis", "Redis sorted sets make priority queues with ZPOPMIN.")
    await _index(runtime, "pg", "PostgreSQL journals every stage completion in a table.")
    resp = await client.get("/v1/search", params={"q": "redis priority queues"})
    assert resp.status == 200
    body = await resp.json()
    assert body["query"] == "redis priority queues"
    assert body["results"][0]["item_id"] == "redis"
    assert set(body["results"][0]) == {"item_id", "text", "score", "owner"}
    assert body["results"][0]["owner"] == "ops"  # the admin token's bare job id
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


async def test_searches_are_bounded_in_number_and_time(runtime, make_client, monkeypatch):
    """More searches at once than the budget: 503 + Retry-After at once, not a queue on the
    database pool; a statement past its time is cancelled: 503 too."""
    await _index(runtime, "doc-1", "Redis sorted sets hold the pipeline's priority queues.")
    started, release = asyncio.Event(), asyncio.Event()
    real_rank = search.rank

    async def slow_rank(*args, **kwargs):
        started.set()
        await release.wait()
        return await real_rank(*args, **kwargs)

    rt = await open_runtime(dataclasses.replace(
        runtime.settings, sections={"search": {"max_concurrent": 1}}))
    try:
        client = await make_client(_app(rt), rt=rt)
        monkeypatch.setattr(search, "rank", slow_rank)
        first = asyncio.create_task(client.get("/v1/search", params={"q": "priority queues"}))
        await asyncio.wait_for(started.wait(), 5)
        busy = await client.get("/v1/search", params={"q": "other words"})
        assert busy.status == 503 and int(busy.headers["Retry-After"]) > 0
        assert (await busy.json())["error"] == "busy"
        release.set()
        assert (await first).status == 200
    finally:
        await rt.close()
    monkeypatch.setattr(search, "rank", real_rank)
    rt = await open_runtime(dataclasses.replace(
        runtime.settings, sections={"search": {"timeout_seconds": 0.000001}}))
    try:
        client = await make_client(_app(rt), rt=rt)
        slow = await client.get("/v1/search", params={"q": "sorted sets"})
        assert slow.status == 503 and (await slow.json())["error"] == "timeout"
    finally:
        await rt.close()


async def test_the_feed_answers_while_many_searches_run(runtime, make_client):
    """The issue's scenario: 12 distinct uncached searches at once, each held in the database
    (a lock on the chunks, as a long scan would hold its connection). The search budget lets
    two run and answers the rest 503 + Retry-After at once, so the client-read pool keeps
    connections for /v1/feed, which answers within a bound meanwhile (without the budget the
    searches took every read connection and the feed waited 5 s, until their statements
    were cancelled)."""
    running = 2  # [search] max_concurrent by default
    await _index(runtime, "doc-1", "Redis sorted sets hold the pipeline's priority queues.")
    async with runtime.pg.acquire() as conn, conn.transaction():
        for i in range(3):
            await feed.append(conn, "pipeline", "store", {"item_id": f"doc-{i}"})
    # The process's budget, not one credential's share (every search here is the admin's).
    rt = await open_runtime(dataclasses.replace(
        runtime.settings, sections={"search": {"per_credential": 12}}))
    app = create_app(rt, components=("gateway.web.health", "gateway.web.search",
                                     "gateway.push.web"))
    client = await make_client(app, rt=rt)
    locker = await asyncpg.connect(runtime.settings.database_url)
    searches: list[asyncio.Task] = []
    try:
        tx = locker.transaction()
        await tx.start()
        await locker.execute("LOCK TABLE pipeline_chunks IN ACCESS EXCLUSIVE MODE")

        async def one(q: str) -> tuple[int, str | None]:
            async with client.get("/v1/search", params={"q": q}) as resp:
                await resp.read()
                return resp.status, resp.headers.get("Retry-After")

        searches = [asyncio.create_task(one(f"distinct query number {i}")) for i in range(12)]

        async def held() -> bool:  # the admitted searches wait in the database
            return await runtime.pg.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query LIKE '%FROM pipeline_chunks%'"
            ) >= running
        await wait_until(held, timeout=10, message="searches held in the database")

        async def read_feed() -> float:
            started = time.monotonic()
            async with client.get("/v1/feed", params={"topic": "pipeline"}) as resp:
                assert resp.status == 200, await resp.text()
                assert len((await resp.json())["rows"]) == 3
            return time.monotonic() - started

        for _ in range(3):  # one at a time, then more at once than the pool has left
            assert await read_feed() < 1.0
        assert max(await asyncio.gather(*(read_feed() for _ in range(4)))) < 1.0
        await wait_until(lambda: sum(t.done() for t in searches) >= len(searches) - running,
                         timeout=10, message="the searches past the budget answered")
        refused = [t.result() for t in searches if t.done()]
        assert all(status == 503 and int(after) > 0 for status, after in refused)
        assert sum(not t.done() for t in searches) == running  # still held meanwhile
        await tx.rollback()
        answers = await asyncio.wait_for(asyncio.gather(*searches), 15)
        assert all(status == 200 or (status == 503 and int(after) > 0)
                   for status, after in answers)
        assert sum(status == 200 for status, _ in answers) >= 1
    finally:
        for task in searches:
            task.cancel()
        await locker.close()
        await rt.close()
