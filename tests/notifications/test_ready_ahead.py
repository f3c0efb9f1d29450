"""A webhook request made ready ahead (encoded and signed while the previous row's cursor was
being written) is sent only for its own row and only while its signature is fresh; anything
else is signed at the send. The receiver verifies with the reference code (its tolerance is
five minutes)."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import pytest

from gateway.notifications import webhook
from gateway.notifications.webhook import WebhookSender
from gateway.push.protocol import FeedRow
from tests.fakes.receiver import Receiver
from tests.notifications.test_outbound_http import loopback_client

SECRET = "whsec_" + base64.b64encode(b"ready-ahead-test-key-24b").decode()


def row(offset: int) -> FeedRow:
    return FeedRow("orders", offset, 1, "order.created", {"text": f"row {offset}"},
                   datetime.now(UTC))


async def test_a_request_made_ready_goes_only_with_its_own_row(receiver: Receiver) -> None:
    secret = SECRET
    client = await loopback_client()
    try:
        sender = WebhookSender(client, receiver.endpoint("a", secret), secret)
        sender.prepare(row(3))
        assert (await sender.send(row(4))).kind == "ok"  # not the one made ready
        assert (await sender.send(row(3))).kind == "ok"
        sender.prepare(row(5))
        assert (await sender.send(row(5))).kind == "ok"
    finally:
        await client.close()
    got = receiver.to("a")
    assert [(d.id, d.body["payload"]["text"]) for d in got] == [
        ("orders:4", "row 4"), ("orders:3", "row 3"), ("orders:5", "row 5")]
    assert all(d.verified for d in got) and receiver.refused == []


async def test_a_request_made_ready_too_long_ago_is_signed_again(
        receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = SECRET
    client = await loopback_client()
    try:
        sender = WebhookSender(client, receiver.endpoint("a", secret), secret)
        then = time.time() - 600  # past the receiver's tolerance, had it been sent as made
        with monkeypatch.context() as patched:
            patched.setattr(webhook.time, "time", lambda: then)
            sender.prepare(row(3))
        assert (await sender.send(row(3))).kind == "ok"
    finally:
        await client.close()
    assert receiver.ids("a") == ["orders:3"] and receiver.refused == []
