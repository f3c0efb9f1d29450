"""The chat platforms as bystanders of the job and webhook limits: a Telegram update through
``POST /telegram/webhook`` (with the secret header) and a signed Slack mention through
``POST /slack/events``, each acknowledged and then answered by its fake platform."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.config import Secret, Settings
from gateway.inbound.telegram import TELEGRAM_BOT
from tests.conversations.fast import with_sections
from tests.fakes import FakeSlack, FakeTelegram, event_callback, text_update
from tests.fakes.pytest_plugin import SLACK_TOKEN, TELEGRAM_TOKEN
from tests.fakes.slack import CHANNEL_ID
from tests.helpers import wait_until
from tests.inbound.test_slack import SIGNING_SECRET, send_event
from tests.inbound.test_telegram import SECRET, post

CHAT_COMPONENTS = ("gateway.inbound.telegram", "gateway.inbound.slack")
_chats = itertools.count(9001)


def with_chat(settings: Settings, fake_telegram: FakeTelegram, fake_slack: FakeSlack,
              **sections: Any) -> Settings:
    """``settings`` with a Telegram bot and a Slack app on the fakes (fast outbound limits),
    keeping the settings' own TOML sections, plus ``sections``."""
    return dataclasses.replace(
        with_sections(settings, **{**settings.sections, **sections}),
        telegram_bot_token=Secret(TELEGRAM_TOKEN), telegram_webhook_secret=Secret(SECRET),
        telegram_api_url=fake_telegram.api_url, slack_bot_token=Secret(SLACK_TOKEN),
        slack_signing_secret=Secret(SIGNING_SECRET), slack_api_url=fake_slack.api_url)


async def chats_go_on(client: TestClient[Any, Any], app: web.Application,
                      fake_telegram: FakeTelegram, fake_slack: FakeSlack) -> None:
    """One Telegram update and one Slack mention through the real routes: both acknowledged
    (200) and both answered on their platform."""
    await wait_until(app[TELEGRAM_BOT].ready.is_set, message="telegram bot ready")
    chat = next(_chats)
    assert await post(client, text_update(f"still here {chat}", chat_id=chat)) == 200
    replies = len(fake_slack.posted_messages(CHANNEL_ID))
    status, text = await send_event(client, event_callback(
        event_type="app_mention", text=f"still here {chat}"))
    assert status == 200, text
    sent = await fake_telegram.wait_for_messages(1, chat_id=chat, timeout=15)
    assert sent[0]["text"].startswith(f"echo: still here {chat}")
    posted = await fake_slack.wait_for_posts(replies + 1, CHANNEL_ID, timeout=15)
    assert any(f"still here {chat}" in str(p.get("text")) for p in posted[replies:])
