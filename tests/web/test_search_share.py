"""One client's search flood no longer fails everyone's searches (issue 24 point 7): a
credential holds at most ``[search] per_credential`` (1) of the process's search slots
(``max_concurrent``, 2), so while a flooding credential keeps searching, a bystander's
searches all succeed and the flooder is told 429 for what passes its share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gateway.access import apikeys
from gateway.knowledge import search
from gateway.stores.runtime import Runtime
from gateway.web.app import create_app
from tests.helpers import wait_until
from tests.knowledge.indexing import index

FLOOD = 40


async def _key(runtime: Runtime) -> dict[str, str]:
    created = await apikeys.create(runtime.pg, "searcher", frozenset({"search:read"}), ())
    return {"Authorization": f"Bearer {created['key']}"}


async def test_a_flooding_credential_leaves_the_bystanders_searches_alone(
        runtime: Runtime, make_client: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    await index(runtime, "doc-1", "Redis sorted sets hold the pipeline's priority queues.")
    client = await make_client(create_app(runtime, components=("gateway.web.search",)))
    flooder, bystander = await _key(runtime), await _key(runtime)
    release = asyncio.Event()
    real_rank = search.rank

    async def rank(rt: Runtime, query: str, *args: Any, **kwargs: Any) -> Any:
        if query.startswith("flood"):
            await release.wait()  # the flooder's searches are slow: they hold their slots
        return await real_rank(rt, query, *args, **kwargs)

    monkeypatch.setattr(search, "rank", rank)

    async def flood(n: int) -> int:
        async with client.get("/v1/search", params={"q": f"flood {n}"},
                              headers=flooder) as response:
            return response.status

    flooding = [asyncio.create_task(flood(n)) for n in range(FLOOD)]
    await wait_until(lambda: sum(task.done() for task in flooding) == FLOOD - 1, timeout=10,
                     message="every flood search but the one in its slot answered")
    statuses = []
    for n in range(20):
        async with client.get("/v1/search", params={"q": f"priority queues {n}"},
                              headers=bystander) as response:
            statuses.append(response.status)
    assert statuses == [200] * 20  # every one of the bystander's searches succeeded
    release.set()
    flooded = await asyncio.gather(*flooding)
    assert sorted(flooded) == [200] + [429] * (FLOOD - 1)  # one slot, its share
