"""A signed webhook travels the whole way: 202, the four stages, the document in PostgreSQL,
``GET /v1/jobs/{id}`` says done, and a redelivery afterwards is still a duplicate."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.app.worker import run_workers
from gateway.pipeline.worker import WorkerConfig
from gateway.stores.runtime import Runtime
from tests.helpers import registry_violations, wait_until
from tests.inbound.webhook_helpers import body_of, standard

FAST = WorkerConfig(lease=2.0, heartbeat=0.3, reclaim_interval=0.2, backoff=0.05,
                    backoff_cap=0.2, idle_max=0.05, shutdown_grace=5)


async def test_webhook_item_is_processed_by_the_pipeline(client: Any, runtime: Runtime) -> None:
    payload = {"type": "issue.opened", "html_url": "https://git.test/i/7",
               "text": "Crash on start, see https://git.test/log #bug @carol"}
    body = body_of(payload)
    headers = standard(body, "evt-7")
    assert (await client.post("/v1/webhooks/demo", data=body, headers=headers)).status == 202

    stop = asyncio.Event()
    workers = asyncio.create_task(run_workers(runtime, stop, config=FAST, concurrency=2))

    async def done() -> bool:
        status = await client.get("/v1/jobs/webhook:demo:evt-7")
        return status.status == 200 and (await status.json())["state"] == "done"

    try:
        await wait_until(done, timeout=20, message="the webhook item to finish all stages")
    finally:
        stop.set()
        await asyncio.wait_for(workers, 10)
    row = await runtime.pg.fetchrow(
        "SELECT title, url, body, document FROM pipeline_documents WHERE item_id = $1",
        "webhook:demo:evt-7")
    assert (row["title"], row["url"], row["body"]) == (
        "issue.opened", "https://git.test/i/7", payload["text"])
    document = row["document"] if isinstance(row["document"], dict) else json.loads(
        row["document"])
    assert document["body"] == payload and document["delivery_id"] == "evt-7"
    edges = {(r["kind"], r["target"]) for r in await runtime.pg.fetch(
        "SELECT kind, target FROM pipeline_edges WHERE item_id = $1", "webhook:demo:evt-7")}
    assert {("tag", "bug"), ("mention", "carol"), ("link", "https://git.test/log")} <= edges
    # The sender retries long after: still one item.
    again = await client.post("/v1/webhooks/demo", data=body, headers=standard(body, "evt-7"))
    assert again.status == 200
    assert await registry_violations(runtime.durable, "durable") == []
