"""The embed stage's provider calls happen outside the batch's transaction (the handler's
``prepare``): while the fake provider holds a call open, the worker holds no PostgreSQL
connection, let alone an open transaction. An item whose call fails fails alone, and the
others' calls are not made again for the one-item-per-transaction redo. A job's usage rows
name its owner namespace as their account."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from gateway.knowledge.stages import DEFAULTS
from gateway.pipeline.stages import meta_key
from gateway.pipeline.worker import StageWorker
from gateway.stores.runtime import Runtime, open_runtime
from tests.fakes.openai import FakeOpenAI, provider_tables
from tests.fakes.pytest_plugin import OPENAI_KEY
from tests.helpers import wait_until
from tests.knowledge.indexing import leased_at_embed
from tests.pipeline.helpers import FAST

WORKER_APP = "gateway-embed-worker-test"
# Job item ids: an account's ("u.<16 hex>/..."), an API key's ("k.<key id>/..."), the
# admin's (bare).
ACCOUNT_JOB = "u.0123456789abcdef/report"
KEY_JOB = "k.a1b2c3d4e5f6/notes"
ADMIN_JOB = "plain"
ITEMS = (ACCOUNT_JOB, KEY_JOB, ADMIN_JOB)


def _named(url: str, application_name: str) -> str:
    """``url`` with ``application_name`` (asyncpg passes unknown query parameters to the
    server as settings), so pg_stat_activity tells the worker's connections apart."""
    parts = urlsplit(url)
    query = "&".join(filter(None, [parts.query, f"application_name={application_name}"]))
    return urlunsplit(parts._replace(query=query))


@pytest.fixture
async def worker_runtime(runtime: Runtime, fake_openai: FakeOpenAI,
                         monkeypatch: pytest.MonkeyPatch
                         ) -> AsyncIterator[Callable[..., Any]]:
    """``await make(**pipeline)``: a runtime embedding with ``fake:emb-1`` whose PostgreSQL
    connections are named ``WORKER_APP``."""
    monkeypatch.setenv("FAKE_OPENAI_KEY", OPENAI_KEY)
    made: list[Runtime] = []

    async def make(**pipeline: Any) -> Runtime:
        settings = dataclasses.replace(
            runtime.settings, database_url=_named(runtime.settings.database_url, WORKER_APP),
            sections={"providers": provider_tables(("fake", fake_openai)),
                      "pipeline": {"embedder": "fake:emb-1", **pipeline}})
        rt = await open_runtime(settings)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        await rt.close()


async def _worker_transactions(observer: Runtime) -> list[dict[str, Any]]:
    """The worker's connections that are in a transaction (from another connection)."""
    rows = await observer.pg.fetch(
        "SELECT state, xact_start, query FROM pg_stat_activity"
        " WHERE application_name = $1 AND xact_start IS NOT NULL", WORKER_APP)
    return [dict(row) for row in rows]


async def test_a_held_provider_call_holds_no_postgres_connection(
        worker_runtime, fake_openai: FakeOpenAI, runtime: Runtime) -> None:
    rt = await worker_runtime()
    leases = await leased_at_embed(rt, ITEMS)
    # The pool has opened connections that pg_stat_activity can see under the name.
    assert await runtime.pg.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", WORKER_APP) >= 1
    fake_openai.hold("embeddings")
    worker = StageWorker(rt, "embed", DEFAULTS["embed"], FAST)
    work = asyncio.create_task(worker.process(leases))
    try:
        await wait_until(lambda: fake_openai.held == 1, timeout=10,
                         message="an embed call held open by the provider")
        in_use = rt.pg.get_size() - rt.pg.get_idle_size()
        assert in_use == 0, f"{in_use} pooled connection(s) held during the provider call"
        assert await _worker_transactions(runtime) == []
        assert await rt.pg.fetchval("SELECT count(*) FROM pipeline_journal") == 0
    finally:
        fake_openai.release("embeddings")
    await asyncio.wait_for(work, 20)

    assert len(fake_openai.calls_to("embeddings")) == 3  # one per item
    assert await rt.pg.fetchval(
        "SELECT count(*) FROM pipeline_chunks WHERE embedder = 'fake:emb-1@8'") == 6
    assert await rt.pg.fetchval(
        "SELECT count(*) FROM pipeline_journal WHERE stage = 'embed'") == 3


async def test_an_items_failed_call_fails_it_alone_and_no_call_is_made_twice(
        worker_runtime, fake_openai: FakeOpenAI) -> None:
    rt = await worker_runtime()
    leases = await leased_at_embed(rt, ITEMS)
    fake_openai.fail("embeddings", 400, message="input refused")  # the first item's call
    worker = StageWorker(rt, "embed", DEFAULTS["embed"], FAST)
    await worker.process(leases)
    calls = fake_openai.calls_to("embeddings")
    assert len(calls) == 3  # the batch's redo, one item per transaction, called nobody again
    refused = next(lease.item_id for lease in leases
                   if calls[0].params["input"][0].startswith(lease.item_id + " "))
    journaled = {r["item_id"] for r in await rt.pg.fetch(
        "SELECT item_id FROM pipeline_journal WHERE stage = 'embed'")}
    assert journaled == set(ITEMS) - {refused}
    assert (await rt.durable.hget(meta_key(), refused)).split("|")[4] == "1"
    assert await rt.pg.fetchval(
        "SELECT count(*) FROM pipeline_chunks WHERE embedder IS NOT NULL") == 4


async def test_a_jobs_usage_rows_name_its_owner_as_the_account(
        worker_runtime, fake_openai: FakeOpenAI) -> None:
    rt = await worker_runtime()
    worker = StageWorker(rt, "embed", DEFAULTS["embed"], FAST)
    await worker.process(await leased_at_embed(rt, ITEMS))
    rows = await rt.pg.fetch("SELECT job_id, account, kind FROM provider_usage")
    assert {(r["job_id"], r["account"], r["kind"]) for r in rows} == {
        (ACCOUNT_JOB, "u.0123456789abcdef", "embeddings"),
        (KEY_JOB, "k.a1b2c3d4e5f6", "embeddings"),
        (ADMIN_JOB, None, "embeddings")}
