"""``gateway worker`` loads the local model before it leases anything, so the first batch
does not hold its leases while the model loads."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.app.worker import run_workers
from gateway.knowledge import embedding
from tests.pipeline.helpers import FAST


async def test_the_local_model_is_loaded_before_the_first_lease(
        runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = embedding.LocalEmbedder()
    monkeypatch.setattr(embedding, "_local", fresh)
    stop = asyncio.Event()
    stop.set()  # start, then stop at once: only what happens before the loops is left
    await asyncio.wait_for(run_workers(runtime, stop, stages=["embed"], config=FAST,
                                       concurrency=1), 30)
    assert fresh._model is not None


async def test_workers_without_the_embed_stage_load_no_model(
        runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = embedding.LocalEmbedder()
    monkeypatch.setattr(embedding, "_local", fresh)
    stop = asyncio.Event()
    stop.set()
    await asyncio.wait_for(run_workers(runtime, stop, stages=["store", "chunk"], config=FAST,
                                       concurrency=1), 30)
    assert fresh._model is None
