"""The search route's budget: a cached answer takes no slot, the time limit covers the query's
embedding as well as the statement, and ``[search]`` values are checked at start."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from gateway.config import ConfigError
from gateway.knowledge import embedders, embedding, search
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app
from gateway.web.search import SearchBudget
from tests.knowledge.indexing import index


def _app(runtime: Runtime) -> web.Application:
    return create_app(runtime, components=("gateway.web.health", "gateway.web.search"))


async def _with_search(runtime: Runtime, **values: Any) -> Runtime:
    return await open_runtime(dataclasses.replace(runtime.settings,
                                                  sections={"search": values}))


async def test_a_cached_answer_is_served_while_every_slot_is_taken(
        runtime: Runtime, make_client: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    await index(runtime, "doc-1", "Redis sorted sets hold the pipeline's priority queues.")
    rt = await _with_search(runtime, max_concurrent=1)
    try:
        client = await make_client(_app(rt), rt=rt)
        first = await client.get("/v1/search", params={"q": "priority queues"})
        assert first.status == 200
        answer = await first.json()
        started, release = asyncio.Event(), asyncio.Event()
        real_rank = search.rank

        async def held_rank(*args: Any, **kwargs: Any) -> Any:
            started.set()
            await release.wait()
            return await real_rank(*args, **kwargs)

        monkeypatch.setattr(search, "rank", held_rank)
        holder = asyncio.create_task(client.get("/v1/search", params={"q": "other words"}))
        await asyncio.wait_for(started.wait(), 5)
        busy = await client.get("/v1/search", params={"q": "third words"})
        assert busy.status == 503 and (await busy.json())["error"] == "busy"
        cached = await client.get("/v1/search", params={"q": "priority queues"})
        assert cached.status == 200 and await cached.json() == answer
        release.set()
        assert (await holder).status == 200
    finally:
        await rt.close()


class _StalledEmbedder:
    """A provider that never answers the query's embedding."""

    name = "stalled"

    async def embed(self, texts: list[str], **_: Any) -> list[np.ndarray]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_the_time_limit_covers_the_querys_embedding(
        runtime: Runtime, make_client: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    rt = await _with_search(runtime, timeout_seconds=0.3)
    try:
        client = await make_client(_app(rt), rt=rt)
        # The local model loaded first (seconds on a loaded machine), so the last search's
        # 0.3 s are its embedding and statement only.
        await embedding.local().embed(["anything at all"])
        monkeypatch.setattr(embedders, "for_runtime", lambda _: _StalledEmbedder())
        began = time.monotonic()
        stalled = await client.get("/v1/search", params={"q": "anything at all"})
        assert stalled.status == 503 and int(stalled.headers["Retry-After"]) > 0
        assert (await stalled.json())["error"] == "timeout"
        assert time.monotonic() - began < 3
        monkeypatch.undo()
        # The slot came back: the next search runs.
        assert (await client.get("/v1/search", params={"q": "anything at all"})).status == 200
    finally:
        await rt.close()


@pytest.mark.parametrize("values", [{"max_concurrent": 0}, {"timeout_seconds": -1},
                                    {"max_concurrent": "many"}, {"slots": 3}])
async def test_bad_search_settings_are_refused_at_start(runtime: Runtime,
                                                        values: dict[str, Any]) -> None:
    rt = dataclasses.replace(runtime, settings=dataclasses.replace(
        runtime.settings, sections={"search": values}))
    with pytest.raises(ConfigError, match=r"\[search\]"):
        SearchBudget(rt)
