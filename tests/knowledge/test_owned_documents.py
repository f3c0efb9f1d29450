"""Tenants stay apart (issue 24, point 1): documents are owned, search returns only what the
credential may read (own namespace, ``docs:<owner>`` topics), its answer cache is kept per
reader scope, and a tenant follows its own items on ``pipeline:<owner>``, not on the
operators' ``pipeline``. Everything runs on the real servers: jobs and webhooks through the
HTTP routes, the real workers, the local embedder."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient

from gateway import keys
from gateway.access.tokens import mint
from gateway.app.dev import CLIENT_SCOPES, client_topics
from gateway.config import Secret
from gateway.knowledge import embedding, search, vectors
from gateway.knowledge.owners import Readable
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app
from tests.helpers import wait_until
from tests.inbound.webhook_helpers import body_of, standard

SECRET = "owned-documents-jwt-secret-0123456789abcdef"
# The case: a tenant's payroll text, with an IBAN.
PAYROLL = ("Payroll March: Jane Doe, net salary 4,210.55 EUR, paid to IBAN "
           "DE89 3704 0044 0532 0130 00 on the 28th.")
IBAN = "DE89 3704 0044 0532 0130 00"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def tenant(sub: str, topics: tuple[str, ...] | None = None) -> dict[str, str]:
    """A tenant's access token as ``gateway dev`` mints its client token: the same scopes
    and (unless given) the same topics, for ``sub``."""
    return bearer(mint(SECRET, sub, CLIENT_SCOPES, client_topics(sub) if topics is None
                       else topics))


@pytest.fixture
async def app(runtime: Runtime, make_client: Callable[..., Any]) -> AsyncIterator[
        tuple[Runtime, TestClient[Any, Any]]]:
    rt = await open_runtime(dataclasses.replace(runtime.settings, jwt_secret=Secret(SECRET)))
    try:
        yield rt, await make_client(create_app(rt), rt=rt)
    finally:
        await rt.close()


async def _done(rt: Runtime, count: int) -> bool:
    return bool(await rt.pg.fetchval(
        "SELECT count(*) FROM pipeline_journal WHERE stage = 'graph'") == count)


async def _submit(client: TestClient[Any, Any], headers: dict[str, str], job_id: str,
                  text: str, **document: str) -> str:
    async with client.post("/v1/jobs", headers=headers, json={
            "job_id": job_id, "document": {"text": text, **document}}) as accepted:
        assert accepted.status == 202, await accepted.text()
        return str((await accepted.json())["item_id"])


async def _search(client: TestClient[Any, Any], headers: dict[str, str], q: str,
                  limit: int = 10, mode: str = "hybrid") -> list[dict[str, Any]]:
    async with client.get("/v1/search", params={"q": q, "limit": str(limit), "mode": mode},
                          headers=headers) as found:
        assert found.status == 200, await found.text()
        return list((await found.json())["results"])


async def _index_through_the_routes(rt: Runtime, client: TestClient[Any, Any]) -> str:
    """Tenant A's payroll job and a webhook delivery from source ``demo``, through the real
    routes and workers; returns A's item id."""
    from tests.pipeline.helpers import workers

    payroll = await _submit(client, tenant("tenant-a"), "payroll-03", PAYROLL,
                            title="Payroll March", url="https://hr.example/payroll/03")
    body = body_of({"type": "invoice.paid", "text": "Invoice 7731 paid by Acme, "
                    "remitted from IBAN GB33 BUKB 2020 1555 5555 55."})
    async with client.post("/v1/webhooks/demo", data=body,
                           headers={**standard(body, "msg_owned_1"),
                                    "Authorization": ""}) as delivered:
        assert delivered.status == 202
    async with workers(rt):
        await wait_until(lambda: _done(rt, 2), timeout=30, message="both documents indexed")
    return payroll


async def test_tenant_b_cannot_find_tenant_as_payroll_through_search(app) -> None:
    rt, client = app
    payroll = await _index_through_the_routes(rt, client)
    owner_a = keys.owner_namespace("tenant-a")
    assert payroll == f"{owner_a}/payroll-03"
    for q in ("payroll salary IBAN", IBAN, "invoice paid by Acme"):
        for mode in ("hybrid", "vector", "text"):
            seen = await _search(client, tenant("tenant-b"), q, mode=mode)
            assert seen == [], (q, mode, seen)  # neither A's job nor the webhook's body
    mine = await _search(client, tenant("tenant-a"), "payroll salary IBAN")
    assert [r["item_id"] for r in mine] == [payroll]  # not the webhook's either
    assert mine[0]["owner"] == owner_a and IBAN in mine[0]["text"]
    assert (mine[0]["title"], mine[0]["url"]) == ("Payroll March",
                                                  "https://hr.example/payroll/03")
    # docs:<owner> topics open an owner's documents, docs:* every one; the admin all.
    webhooks = await _search(client, tenant("tenant-b", ("docs:src.demo",)), "invoice paid")
    assert [r["owner"] for r in webhooks] == ["src.demo"]
    everything = await _search(client, tenant("tenant-b", ("docs:*",)), "paid IBAN")
    assert {r["owner"] for r in everything} == {owner_a, "src.demo"}
    admin = await _search(client, {}, "paid IBAN")  # the client's default: the admin token
    assert {r["owner"] for r in admin} == {owner_a, "src.demo"}


async def test_the_answer_cache_does_not_leak_across_scopes(app) -> None:
    rt, client = app
    await _index_through_the_routes(rt, client)
    first = await _search(client, tenant("tenant-a"), "salary paid to IBAN")
    assert first and first[0]["owner"] == keys.owner_namespace("tenant-a")
    # B asks the very same question right after: A's cached answer must not be served.
    assert await _search(client, tenant("tenant-b"), "salary paid to IBAN") == []
    answers = [k async for k in rt.cache.scan_iter("cache:*")
               if k != search.generation_key()]
    assert len(answers) == 2  # one per reader scope
    # A reader with the same scope as A (another token of A) shares A's answer.
    hits = await _search(client, tenant("tenant-a"), "salary paid to IBAN")
    assert hits == first


async def test_tenant_b_cannot_read_tenant_as_pipeline_progress(app) -> None:
    rt, client = app
    payroll = await _index_through_the_routes(rt, client)
    owner_a, owner_b = keys.owner_namespace("tenant-a"), keys.owner_namespace("tenant-b")
    # The dev client's topics give B its own progress, not the operators' topic.
    for topic in ("pipeline", f"pipeline:{owner_a}"):
        async with client.get("/v1/feed", params={"topic": topic},
                              headers=tenant("tenant-b")) as refused:
            assert refused.status == 403, topic
        async with client.get("/v1/stream", params={"topics": topic},
                              headers=tenant("tenant-b")) as refused:
            assert refused.status == 403, topic
    async with client.get("/v1/feed", params={"topic": f"pipeline:{owner_b}"},
                          headers=tenant("tenant-b")) as own:
        assert own.status == 200 and (await own.json())["rows"] == []
    # A follows its own item through every stage on its topic, and nothing else there.
    async with client.get("/v1/feed", params={"topic": f"pipeline:{owner_a}"},
                          headers=tenant("tenant-a")) as progress:
        assert progress.status == 200
        rows = (await progress.json())["rows"]
    assert [(r["payload"]["item_id"], r["kind"]) for r in rows] == [
        (payroll, stage) for stage in ("store", "chunk", "embed", "graph")]
    assert [r["offset"] for r in rows] == [1, 2, 3, 4]
    # Its own progress needs no pattern (as its own documents need none).
    async with client.get("/v1/feed", params={"topic": f"pipeline:{owner_a}"},
                          headers=tenant("tenant-a", ())) as implicit:
        assert implicit.status == 200 and len((await implicit.json())["rows"]) == 4
    # The operators' topic still has every item's completions.
    async with client.get("/v1/feed", params={"topic": "pipeline"}) as everything:
        items = {r["payload"]["item_id"] for r in (await everything.json())["rows"]}
    assert items == {payroll, "webhook:demo:msg_owned_1"}


DIMS = 64
MODEL = f"test:owned@{DIMS}"
COLUMNS = ["item_id", "seq", "body", "embedding", "embedder", "owner"]


async def _plan_and_walk(runtime: Runtime, query: np.ndarray, readable: Readable,
                         statements: list[str]) -> tuple[str, list[str]]:
    """The plan of the ranked statement and what the walk alone returns (no exact pass)."""
    sql, params = vectors.nearest_sql(True, MODEL, DIMS, readable)
    async with runtime.pg.acquire() as conn, conn.transaction():
        for statement in statements:
            await conn.execute(statement)
        plan = "\n".join(r[0] for r in await conn.fetch(
            "EXPLAIN " + sql, query.tolist(), 5, *params))
        walked = await conn.fetch(sql, query.tolist(), 5, *params)
    return plan, [r["item_id"] for r in walked]


async def test_limit_results_come_back_when_most_documents_are_unreadable(
        runtime: Runtime) -> None:
    """2,000 chunks of tenant A sit right around the query, B's further away: B's search for
    5 still gets 5 of B's, the owner filter inside the statement. With 12 of B's the planner
    ranks them exactly through the owner index; with 1,000 (a third of the chunks) it walks
    the HNSW index, and the walk goes on past A's chunks (pgvector's iterative scan) where a
    plain walk (40 candidates, all A's) would return none."""
    if not (await vectors.layout(runtime)).pgvector:
        pytest.skip("the test database has no pgvector")
    rng = np.random.default_rng(24)
    query = embedding.normalise(rng.normal(size=(1, DIMS)))[0]
    near = embedding.normalise(query + 0.3 * rng.normal(size=(2000, DIMS)) / np.sqrt(DIMS))
    far = embedding.normalise(query + 3.0 * rng.normal(size=(1000, DIMS)) / np.sqrt(DIMS))
    await runtime.pg.copy_records_to_table(
        "pipeline_chunks", columns=COLUMNS,
        records=[(f"k.a/{i}", 0, "a", row, MODEL, "k.a") for i, row in enumerate(near)]
        + [(f"k.b/{i}", 0, "b", row, MODEL, "k.b") for i, row in enumerate(far[:12])])
    await runtime.pg.execute("ANALYZE pipeline_chunks")
    await vectors.ensure_index(runtime, MODEL, DIMS)
    layout = await vectors.layout(runtime)
    walk = vectors.walk_settings(layout, 5, filtered=True)
    for reader in (Readable.of("k.b", ()), Readable.of(None, ("docs:k.b*",))):
        exact = sorted(range(12), key=lambda i: -float(far[i] @ query))[:5]
        found = await vectors.nearest(runtime, query, MODEL, 5, reader)
        assert [r["item_id"] for r in found] == [f"k.b/{i}" for i in exact], reader
        assert {r["owner"] for r in found} == {"k.b"}
    plan, _ = await _plan_and_walk(runtime, query, Readable.of("k.b", ()), walk)
    assert "pipeline_chunks_owner" in plan, plan  # 12 rows: ranked exactly, not a table scan

    await runtime.pg.copy_records_to_table(
        "pipeline_chunks", columns=COLUMNS,
        records=[(f"k.b/{i}", 0, "b", row, MODEL, "k.b") for i, row in enumerate(far)
                 if i >= 12])
    await runtime.pg.execute("ANALYZE pipeline_chunks")
    reader_b = Readable.of("k.b", ())
    plan, walked = await _plan_and_walk(runtime, query, reader_b, walk)
    assert vectors.index_name(MODEL) in plan, plan
    assert len(walked) == 5 and all(item.startswith("k.b/") for item in walked)
    exact = sorted(range(len(far)), key=lambda i: -float(far[i] @ query))[:5]
    assert len(set(walked) & {f"k.b/{i}" for i in exact}) >= 4  # approximate, but close
    _, plain = await _plan_and_walk(runtime, query, reader_b, [])
    assert len(plain) < 5  # what the filter alone would give: the walk ends among A's
    found = await vectors.nearest(runtime, query, MODEL, 5, reader_b)
    assert [r["item_id"] for r in found] == walked
    # A's own search is A's nearest, none of B's.
    found_a = await vectors.nearest(runtime, query, MODEL, 5, Readable.of("k.a", ()))
    assert len(found_a) == 5 and {r["owner"] for r in found_a} == {"k.a"}
