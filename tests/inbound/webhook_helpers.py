"""Building signed webhook requests for the tests (Standard Webhooks, GitHub, Stripe)."""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.config import parse_webhook_secrets
from gateway.inbound import signing
from tests.conftest import TEST_WEBHOOK_SOURCES

SOURCES = parse_webhook_secrets("GATEWAY_WEBHOOK_SECRETS", TEST_WEBHOOK_SOURCES)
JSON = {"Content-Type": "application/json"}


def body_of(payload: Any) -> bytes:
    return json.dumps(payload).encode()


def standard(body: bytes, msg_id: str, timestamp: int | None = None,
             source: str = "demo") -> dict[str, str]:
    ts = int(time.time()) if timestamp is None else timestamp
    return {**JSON, **signing.sign_standard(SOURCES[source].key_bytes(), msg_id, ts, body)}


def github(body: bytes, delivery: str) -> dict[str, str]:
    return {**JSON, "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": signing.github_signature(SOURCES["gh"].key_bytes(), body)}


def stripe(body: bytes, timestamp: int | None = None) -> dict[str, str]:
    ts = int(time.time()) if timestamp is None else timestamp
    return {**JSON, **signing.sign_stripe(SOURCES["stripe"].key_bytes(), ts, body)}


async def post_as_sender(client: Any, path: str, data: bytes, headers: dict[str, str]) -> Any:
    """POST as a webhook sender does: a 503 (a store slow to answer, with Retry-After) is sent
    again, three tries at most; the last answer. On a loaded 2-core machine a write can
    outlast the inbound write budget (a three-master cluster's round trips, an AOF batch's
    fsync wait)."""
    for _ in range(3):
        response = await client.post(path, data=data, headers=headers)
        if response.status != 503:
            break
        assert response.headers["Retry-After"]
    return response
