"""Fast limits and retry timings so conversation and adapter tests stay bounded."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.config import Settings
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app

FAST_LIMITS: dict[str, Any] = {
    "platforms": {
        "telegram": {"bot": {"rate": 1000, "period": 1, "burst": 1000},
                     "chat": {"rate": 1000, "period": 1, "burst": 1000}},
        "slack": {"channel": {"rate": 1000, "period": 1, "burst": 1000}},
        "mattermost": {"bot": {"rate": 1000, "period": 1, "burst": 1000}},
    },
}


def with_sections(settings: Settings, **sections: Any) -> Settings:
    """``settings`` with fast limits and retries, plus any extra TOML sections."""
    merged = {"ratelimit": FAST_LIMITS, "outbound": {"backoff": 0.01, "attempts": 3},
              **sections}
    return dataclasses.replace(settings, sections=merged)


class Apps:
    """Full apps, each on its own runtime; ``close`` stops every app (draining its background
    work) before closing its stores."""

    def __init__(self, make_client: Callable[..., Awaitable[TestClient[Any, Any]]]) -> None:
        self.make_client = make_client
        self.started: list[tuple[TestClient[Any, Any], Runtime]] = []

    async def start(self, settings: Settings,
                    components: Sequence[str]) -> tuple[TestClient[Any, Any], web.Application]:
        rt = await open_runtime(settings)
        app = create_app(rt, components)
        client = await self.make_client(app=app, rt=rt)
        self.started.append((client, rt))
        return client, app

    async def close(self) -> None:
        for client, rt in self.started:
            await client.close()
            await rt.close()
