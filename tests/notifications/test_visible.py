"""Delivery is visible: ``/metrics`` counts rows delivered and failed attempts per
destination type and the rows held subscriptions are behind; the dashboard's summary shows
the subscriptions by state with the ones furthest behind; the dashboard page has the card."""

from __future__ import annotations

import re
from typing import Any

from gateway.stores.runtime import Runtime
from tests.fakes.receiver import Receiver
from tests.helpers import wait_until
from tests.notifications.conftest import publish, subscribe


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


async def metrics(client: Any) -> str:
    return str(await (await client.get("/metrics")).text())


async def test_metrics_count_deliveries_failures_and_lag(
        app_with: Any, receiver: Receiver, runtime: Runtime) -> None:
    client = await app_with(retry_seconds=[30])  # a failed row waits: its lag stays
    before = await metrics(client)
    delivered = 'gateway_notifications_delivered_total{type="webhook"}'
    failed = 'gateway_notifications_failed_total{type="webhook"}'
    await subscribe(client, "ok", receiver.endpoint("ok"))
    await subscribe(client, "bad", receiver.endpoint("bad"))
    receiver.fail("bad", 500, times=100)
    await publish(client, "ok", 3)
    await publish(client, "bad", 2)
    await wait_until(lambda: len(receiver.to("ok")) == 3 and len(receiver.to("bad")) == 1,
                     timeout=15)

    async def counted() -> bool:
        text = await metrics(client)
        return (metric(text, delivered) - metric(before, delivered) == 3
                and metric(text, failed) - metric(before, failed) == 1
                and metric(text, "gateway_notifications_lag_rows") == 2)

    await wait_until(counted, timeout=10, message="3 delivered, 1 failed, 2 rows behind")
    assert metric(await metrics(client), "gateway_notifications_held_subscriptions") == 2

    summary = (await (await client.get("/v1/dashboard/summary")).json())["notifications"]
    assert (summary["total"], summary["active"], summary["paused"], summary["lag"]) == (
        2, 2, 0, 2)
    first = summary["behind"][0]
    assert (first["topic"], first["type"], first["state"], first["lag"]) == (
        "bad", "webhook", "active", 2)
    assert "500" in first["last_error"]
    page = await (await client.get("/")).text()
    assert 'id="notifications"' in page and 'id="subscriptions"' in page
