"""A ``serve`` with all three chat platforms stops within its grace period: the inbox
consumers (and the Mattermost listener) drain side by side, not one after another. Real
bot libraries against the fakes, real Redis and PostgreSQL."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from gateway.config import Secret, Settings
from gateway.stores.runtime import Runtime
from tests.conversations import gated
from tests.conversations.fast import Apps, with_sections
from tests.conversations.platforms import SLACK_SECRET, WEBHOOK_SECRET
from tests.fakes import FakeMattermost, FakeSlack, FakeTelegram, event_callback, text_update
from tests.fakes.pytest_plugin import SLACK_TOKEN, TELEGRAM_TOKEN
from tests.fakes.slack import signed_json
from tests.helpers import wait_until
from tests.inbound.mattermost.helpers import mattermost_settings

DRAIN_SECONDS = 2.0
COMPONENTS = ("gateway.web.health", "gateway.inbound.mattermost.component",
              "gateway.inbound.telegram", "gateway.inbound.slack")


async def test_three_platforms_with_a_reply_each_in_hand_stop_in_one_drain(
        runtime: Runtime, settings: Settings, fake_telegram: FakeTelegram,
        fake_slack: FakeSlack, fake_mattermost: FakeMattermost,
        make_client: Callable[..., Any], gates: gated.Gates) -> None:
    """Each platform's consumer holds a chat whose handler never ends: each waits its
    ``drain_seconds`` (2 s) for it, then gives the chat back. Side by side that is one
    drain; one after another it was three (6 s and more), which with the production figures
    (10 s each, after up to 10 s of requests) passed a 30 s grace period."""
    sections = {**gated.sections(lease_seconds=30),
                "inbox": {"poll_seconds": 0.05, "drain_seconds": DRAIN_SECONDS}}
    configured = dataclasses.replace(
        mattermost_settings(with_sections(settings, **sections), fake_mattermost.url),
        telegram_bot_token=Secret(TELEGRAM_TOKEN),
        telegram_webhook_secret=Secret(WEBHOOK_SECRET), telegram_api_url=fake_telegram.api_url,
        slack_bot_token=Secret(SLACK_TOKEN), slack_signing_secret=Secret(SLACK_SECRET),
        slack_api_url=fake_slack.api_url)
    configured = dataclasses.replace(configured, sections={
        **configured.sections, "inbox": sections["inbox"]})
    apps, closed = Apps(make_client), False
    try:
        client, _ = await apps.start(configured, COMPONENTS)
        await fake_mattermost.wait_for_sockets(1)
        async with client.post("/telegram/webhook", json=text_update("tg"), headers={
                "X-Telegram-Bot-Api-Secret-Token": WEBHOOK_SECRET}) as answer:
            assert answer.status == 200, await answer.text()
        body, headers = signed_json(SLACK_SECRET, event_callback(event_type="app_mention",
                                                                 text="slack"))
        async with client.post("/slack/events", data=body, headers=headers) as answer:
            assert answer.status == 200, await answer.text()
        await fake_mattermost.create_post("general", "mm")
        await wait_until(lambda: all(gates.entered[run].is_set() for run in (1, 2, 3)),
                         timeout=10, message="a reply in hand on each platform")
        started = time.monotonic()
        closed = True
        await apps.close()
        stopped_in = time.monotonic() - started
    finally:
        if not closed:
            await apps.close()
    assert stopped_in < 2 * DRAIN_SECONDS, stopped_in
