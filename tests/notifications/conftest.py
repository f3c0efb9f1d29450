"""Apps that deliver notifications fast (short leases, polls and retry delays), to local
receivers on loopback (plain http and private addresses allowed), and helpers to publish
and subscribe through the HTTP API as a client would."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.stores.runtime import Runtime
from gateway.web.app import create_app
from tests.fakes.receiver import Receiver

FAST = {"allow_http": True, "allow_private_networks": True, "poll_seconds": 0.3,
        "lease_seconds": 1.5, "retry_seconds": [0.2, 0.4], "give_up_after_seconds": 30,
        "request_seconds": 3, "connect_seconds": 1}


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with Receiver() as server:
        yield server


@pytest.fixture
def app_with(runtime: Runtime, make_client: Callable[..., Any]) -> Callable[..., Any]:
    """``await app_with(**[notifications] changes)`` → a client on a full app delivering
    with ``FAST`` settings and the changes."""

    async def start(**notifications: Any) -> Any:
        sections = {**runtime.settings.sections,
                    "notifications": {**FAST, **notifications}}
        settings = dataclasses.replace(runtime.settings, sections=sections)
        return await make_client(create_app(dataclasses.replace(runtime, settings=settings)))

    return start


async def publish(client: Any, topic: str, n: int = 1, **body: Any) -> list[int]:
    offsets = []
    for _ in range(n):
        response = await client.post(f"/v1/topics/{topic}/events", json=body)
        assert response.status == 202, await response.text()
        offsets.append((await response.json())["offset"])
    return offsets


async def subscribe(client: Any, topic: str, url: str, **fields: Any) -> dict[str, Any]:
    response = await client.post("/v1/subscriptions", json={
        "topic": topic, "destination": {"type": "webhook", "url": url}, **fields})
    assert response.status == 201, await response.text()
    return dict(await response.json())
