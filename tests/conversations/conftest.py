"""A runtime with fast limits so conversation tests stay bounded; ``chat``, a platform's
chat (parametrize it indirectly with the platform's name)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from gateway.config import Settings
from gateway.stores.runtime import Runtime, open_runtime
from tests.conversations import gated
from tests.conversations.fast import with_sections
from tests.conversations.platforms import Chat, chat_on
from tests.fakes import FakeMattermost, FakeSlack, FakeTelegram


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


@pytest.fixture
async def chat(request: pytest.FixtureRequest, runtime: Runtime, settings: Settings,
               make_client: Callable[..., Any], fake_telegram: FakeTelegram,
               fake_slack: FakeSlack, fake_mattermost: FakeMattermost) -> AsyncIterator[Chat]:
    """The chat of ``request.param`` (the fakes are cheap: all three start)."""
    fakes = {"telegram": fake_telegram, "slack": fake_slack, "mattermost": fake_mattermost}
    async with chat_on(request.param, settings, fakes[request.param], make_client) as opened:
        yield opened


@pytest.fixture
def gates() -> Iterator[gated.Gates]:
    """Fresh gates for ``tests.conversations.gated:handler``."""
    with gated.fresh() as fresh:
        yield fresh
