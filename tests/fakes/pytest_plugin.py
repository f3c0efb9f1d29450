"""Ready-made pytest fixtures for the fakes.

Enable from the root ``conftest.py`` with
``pytest_plugins = ["tests.fakes.pytest_plugin"]``; each fixture starts a fresh
fake in the test's event loop and closes it afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from tests.fakes.mattermost import FakeMattermost
from tests.fakes.openai import FakeOpenAI
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram

TELEGRAM_TOKEN = "123456:TEST-telegram-token"
SLACK_TOKEN = "xoxb-test-token"
MATTERMOST_TOKEN = "mm-test-token"
OPENAI_KEY = "sk-test-provider-key"


@pytest_asyncio.fixture
async def fake_telegram() -> AsyncIterator[FakeTelegram]:
    """A running ``FakeTelegram`` accepting only ``TELEGRAM_TOKEN``."""
    async with FakeTelegram(token=TELEGRAM_TOKEN) as fake:
        yield fake


@pytest_asyncio.fixture
async def fake_slack() -> AsyncIterator[FakeSlack]:
    """A running ``FakeSlack`` accepting only ``SLACK_TOKEN``."""
    async with FakeSlack(token=SLACK_TOKEN) as fake:
        yield fake


@pytest_asyncio.fixture
async def fake_mattermost() -> AsyncIterator[FakeMattermost]:
    """A running ``FakeMattermost`` whose personal access token is ``MATTERMOST_TOKEN``."""
    async with FakeMattermost(token=MATTERMOST_TOKEN) as fake:
        yield fake


@pytest_asyncio.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    """A running ``FakeOpenAI`` (8-dimensional vectors) accepting only ``OPENAI_KEY``."""
    async with FakeOpenAI(api_key=OPENAI_KEY) as fake:
        yield fake
