"""What one job can add to PostgreSQL is bounded by the per-document caps, not only by the
body limit: a 1 MiB document of distinct #tags (through POST /v1/jobs and the real workers)
completes with at most ``GATEWAY_MAX_EDGES_PER_DOCUMENT`` edge rows, and a document that
splits into more chunks than ``GATEWAY_MAX_CHUNKS_PER_DOCUMENT`` keeps that many, each
embedded."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from typing import Any

from gateway.config import Settings
from gateway.knowledge.stages import MAX_LINK_BYTES, split_text
from gateway.pipeline.status import job_status
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app
from tests.helpers import wait_until
from tests.pipeline.helpers import workers

COMPONENTS = ("gateway.web.health", "gateway.inbound.jobs")


def filled(head: str, word: Callable[[int], str], size: int) -> str:
    """``head`` then ``word(0) word(1) ...`` up to ``size`` characters."""
    words, length, i = [head], len(head), 0
    while length + len(word(i)) + 1 <= size:
        words.append(word(i))
        length += len(word(i)) + 1
        i += 1
    return " ".join(words)


async def run_job(rt: Runtime, make_client: Callable[..., Any], text: str) -> dict[str, Any]:
    """POST ``text`` as a job whose body is just under the body limit; run the workers until
    the job leaves the pipeline; its status."""
    body = json.dumps({"job_id": "big", "document": {"text": text}}).encode()
    assert len(body) <= rt.settings.max_body_bytes
    client = await make_client(create_app(rt, COMPONENTS), rt=rt)
    async with client.post("/v1/jobs", data=body,
                           headers={"Content-Type": "application/json"}) as response:
        assert response.status == 202, await response.text()

    async def finished() -> dict[str, Any] | None:
        status = await job_status(rt, "big")
        return status if status and status["state"] in ("done", "dead") else None

    async with workers(rt):
        return await wait_until(finished, timeout=120, message="the job left the pipeline")


async def counts(rt: Runtime) -> dict[str, int]:
    row = await rt.pg.fetchrow(
        "SELECT (SELECT count(*) FROM pipeline_edges) AS edges,"
        " (SELECT count(*) FROM pipeline_edges WHERE kind = 'link') AS links,"
        " (SELECT count(*) FROM pipeline_chunks) AS chunks,"
        " (SELECT count(*) FROM pipeline_chunks WHERE embedding IS NOT NULL) AS vectors,"
        " (SELECT count(*) FROM pipeline_dead_letters) AS dead")
    return dict(row)


async def test_a_mebibyte_of_distinct_tags_stops_at_the_edge_cap(
        settings: Settings, runtime: Runtime, make_client: Callable[..., Any]) -> None:
    # A link too long for an index row leads (it is skipped: inserted, it would fail the
    # item at every try and dead-letter it), then a link, a mention and ~100,000 distinct
    # tags.
    noise = random.Random(15).randbytes(MAX_LINK_BYTES * 2).hex()  # incompressible
    head = f"https://example.com/{noise} https://example.com/short @alice"
    text = filled(head, lambda i: f"#t{i:06d}", settings.max_body_bytes - 100)
    assert text.count("#t") > 100 * settings.max_edges_per_document
    status = await run_job(runtime, make_client, text)
    assert status["state"] == "done", status
    found = await counts(runtime)
    assert found["edges"] == settings.max_edges_per_document == 1000, found
    assert found["links"] == 1 and found["dead"] == 0, found
    assert 0 < found["chunks"] == found["vectors"] <= settings.max_chunks_per_document
    edges = {r["target"] for r in await runtime.pg.fetch(
        "SELECT target FROM pipeline_edges WHERE kind = 'tag'")}
    assert edges == {f"t{i:06d}" for i in range(998)}  # the first ones in the text


async def test_chunks_stop_at_the_chunk_cap(
        settings: Settings, runtime: Runtime, make_client: Callable[..., Any]) -> None:
    rt = await open_runtime(dataclasses.replace(settings, max_chunks_per_document=40,
                                                max_edges_per_document=5))
    try:
        # Paragraphs of 401 characters: each is a chunk of its own (the most chunks a text
        # of this size splits into), about 2,550 of them; JSON escapes each "\n" in 2 bytes.
        text = filled("start.", lambda i: "\n\n" + "w" * 399 + f"{i % 100:02d}",
                      settings.max_body_bytes * 98 // 100)
        assert len(split_text(text)) > 2500
        status = await run_job(rt, make_client, text)
        assert status["state"] == "done", status
        found = await counts(rt)
        assert found == {"edges": 0, "links": 0, "chunks": 40, "vectors": 40, "dead": 0}
        seqs = [r["seq"] for r in await rt.pg.fetch(
            "SELECT seq FROM pipeline_chunks ORDER BY seq")]
        assert seqs == list(range(40))  # the document's first chunks
    finally:
        await rt.close()
