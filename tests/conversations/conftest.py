"""A runtime with fast limits so conversation tests stay bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.config import Settings
from gateway.stores.runtime import Runtime, open_runtime
from tests.conversations.fast import with_sections


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
