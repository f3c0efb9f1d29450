"""Fixtures for push tests: an app with the push component and tunable push settings."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.push.client import PushClient
from gateway.push.web import HUB
from gateway.stores.runtime import Runtime
from gateway.web.app import create_app
from tests.conftest import TEST_ADMIN_TOKEN

PUSH_COMPONENTS = ("gateway.web.health", "gateway.push.web")
# Fast timings so that the fallbacks (polls) show within a test's patience.
FAST = {"poll_seconds": 0.5, "degraded_poll_seconds": 0.2, "subscribe_timeout_seconds": 2}


ADMIN_AUTH = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}


def with_push(runtime: Runtime, **push: Any) -> Runtime:
    sections = {**runtime.settings.sections, "push": {**FAST, **push}}
    return Runtime(replace(runtime.settings, sections=sections), runtime.durable,
                   runtime.cache, runtime.pg)


@pytest.fixture
async def push_server(make_client: Callable[..., Any], runtime: Runtime) -> Callable[..., Any]:
    """``await push_server(rt=None, **push_settings)`` → a TestClient on the push app."""

    async def factory(rt: Runtime | None = None, **push: Any) -> TestClient[Any, Any]:
        configured = with_push(rt or runtime, **push)
        app = create_app(configured, PUSH_COMPONENTS)
        return await make_client(app=app)  # type: ignore[no-any-return]

    return factory


def base_url(client: TestClient[Any, Any]) -> str:
    return str(client.make_url("")).rstrip("/")


def hub_of(client: TestClient[Any, Any]) -> Any:
    return client.server.app[HUB]


@pytest.fixture
async def push_clients() -> AsyncIterator[Callable[..., PushClient]]:
    """Start PushClients that are closed at the end of the test."""
    started: list[PushClient] = []

    async def factory(url: str, topics: list[str], **kwargs: Any) -> PushClient:
        kwargs.setdefault("headers", ADMIN_AUTH)
        client = await PushClient(url, topics, **kwargs).start()
        started.append(client)
        return client

    yield factory  # type: ignore[misc]
    for client in started:
        await client.close()
