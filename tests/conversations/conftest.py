"""Settings with fast limits so conversation tests stay bounded."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.config import Settings
from gateway.runtime import Runtime, open_runtime

FAST_LIMITS: dict[str, Any] = {
    "platforms": {
        "telegram": {"bot": {"rate": 1000, "period": 1, "burst": 1000},
                     "chat": {"rate": 1000, "period": 1, "burst": 1000}},
        "slack": {"channel": {"rate": 1000, "period": 1, "burst": 1000}},
        "mattermost": {"bot": {"rate": 1000, "period": 1, "burst": 1000}},
    },
}


def with_sections(settings: Settings, **sections: Any) -> Settings:
    merged = {"ratelimit": FAST_LIMITS, "outbound": {"backoff": 0.01, "attempts": 3},
              **sections}
    return dataclasses.replace(settings, sections=merged)


@pytest.fixture
def fast_settings(settings: Settings) -> Settings:
    return with_sections(settings)


@pytest.fixture
async def fast_runtime(runtime: Runtime, fast_settings: Settings) -> AsyncIterator[Runtime]:
    """A runtime on the (reset) test stores with fast limits."""
    rt = await open_runtime(fast_settings)
    try:
        yield rt
    finally:
        await rt.close()
