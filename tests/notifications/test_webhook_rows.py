"""Every accepted signed webhook becomes a row on ``webhook:<source>`` once its document is
stored: kind = the event's type (Standard Webhooks body ``type``, ``X-GitHub-Event``, Stripe
``type``, else ``webhook``), payload ``{item_id, type, summary}``. The ingest request itself
writes nothing to PostgreSQL: the row comes from the store stage."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.app.worker import run_workers
from gateway.stores.runtime import Runtime
from tests.helpers import wait_until
from tests.inbound.test_webhooks_e2e import FAST
from tests.inbound.webhook_helpers import body_of, github, post_as_sender, standard, stripe


async def rows(client: Any, topic: str) -> list[dict[str, Any]]:
    page = await (await client.get(f"/v1/feed?topic={topic}")).json()
    return list(page["rows"])


async def test_stored_webhooks_appear_on_their_source_topic(
        client: Any, runtime: Runtime) -> None:
    typed = body_of({"type": "invoice.paid", "text": "Invoice 12 paid"})
    untyped = body_of({"text": "x" * 700})
    pushed = body_of({"ref": "refs/heads/main", "title": "Push to main"})
    charged = body_of({"id": "evt_1", "type": "charge.succeeded"})
    sent = [await post_as_sender(client, "/v1/webhooks/demo", typed, standard(typed, "m1")),
            await post_as_sender(client, "/v1/webhooks/demo", untyped, standard(untyped, "m2")),
            await post_as_sender(client, "/v1/webhooks/gh", pushed, {
                **github(pushed, "d-1"), "X-GitHub-Event": "push"}),
            await post_as_sender(client, "/v1/webhooks/stripe", charged, stripe(charged))]
    assert [r.status for r in sent] == [202] * 4
    # Accepted, not stored yet: nothing in PostgreSQL for them, pending or numbered.
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed") == 0
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed_pending") == 0

    stop = asyncio.Event()
    workers = asyncio.create_task(run_workers(runtime, stop, config=FAST, concurrency=1,
                                              stages=["store"]))
    try:
        async def stored() -> bool:
            return len(await rows(client, "webhook:demo")) == 2 and all(
                [await rows(client, "webhook:gh"), await rows(client, "webhook:stripe")])
        await wait_until(stored, timeout=20, message="a row per stored webhook")
    finally:
        stop.set()
        await asyncio.wait_for(workers, 10)
    demo = sorted(await rows(client, "webhook:demo"), key=lambda r: r["payload"]["item_id"])
    assert [(r["kind"], r["payload"]) for r in demo] == [
        ("invoice.paid", {"item_id": "webhook:demo:m1", "type": "invoice.paid",
                          "summary": "invoice.paid"}),
        ("webhook", {"item_id": "webhook:demo:m2", "type": "webhook", "summary": "x" * 500})]
    [gh] = await rows(client, "webhook:gh")
    assert (gh["offset"], gh["kind"], gh["payload"]) == (1, "push", {
        "item_id": "webhook:gh:d-1", "type": "push", "summary": "Push to main"})
    [charge] = await rows(client, "webhook:stripe")
    assert (charge["kind"], charge["payload"]["type"]) == ("charge.succeeded",
                                                          "charge.succeeded")
    assert {r["offset"] for r in demo} == {1, 2}
