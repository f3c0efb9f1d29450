"""The key registry holds against a full scenario.

One app with every component, pipeline workers, the Telegram and Slack bots and the
Mattermost listener, all pointed at the fakes, is driven through each inbound path (signed
webhook, a GitHub delivery and its replay, job, Telegram update, Slack event, Mattermost
post), a bad-signature barrier, the feed, the stream and a cached search. Then both
instances are scanned: every key matches a registry row, lives in the instance that row
names, and carries a TTL where it must.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.app.worker import service as pipeline_service
from gateway.config import Secret, Settings
from gateway.stores.runtime import Runtime, open_runtime
from tests.conversations.fast import with_sections
from tests.fakes import FakeMattermost, FakeSlack, FakeTelegram, event_callback, text_update
from tests.fakes.pytest_plugin import SLACK_TOKEN, TELEGRAM_TOKEN
from tests.fakes.slack import signed_json
from tests.helpers import registry_violations, wait_until
from tests.inbound.mattermost.helpers import mattermost_settings
from tests.inbound.webhook_helpers import body_of, github, standard

pytestmark = pytest.mark.slow
TELEGRAM_SECRET = "scenario-secret"
SLACK_SECRET = "scenario-signing-secret"


def scenario_settings(settings: Settings, telegram: FakeTelegram, slack: FakeSlack,
                      mattermost: FakeMattermost) -> Settings:
    settings = mattermost_settings(with_sections(settings), mattermost.url)
    return dataclasses.replace(
        settings,
        telegram_bot_token=Secret(TELEGRAM_TOKEN), telegram_api_url=telegram.api_url,
        telegram_webhook_secret=Secret(TELEGRAM_SECRET),
        slack_bot_token=Secret(SLACK_TOKEN), slack_signing_secret=Secret(SLACK_SECRET),
        slack_api_url=slack.api_url)


async def _job_done(client: TestClient[Any, Any], item_id: str) -> bool:
    async with client.get(f"/v1/jobs/{item_id}") as response:
        return response.status == 200 and (await response.json())["state"] == "done"


async def test_every_key_of_a_full_scenario_is_registered(
        runtime: Runtime, settings: Settings, make_client: Any, fake_telegram: FakeTelegram,
        fake_slack: FakeSlack, fake_mattermost: FakeMattermost) -> None:
    full = scenario_settings(settings, fake_telegram, fake_slack, fake_mattermost)
    rt = await open_runtime(full)
    stop = asyncio.Event()
    workers = asyncio.create_task(pipeline_service(concurrency=4)(rt, stop))
    try:
        client = await make_client(rt=rt)

        # Signed webhook and a job through all four stages.
        body = body_of({"text": "see https://example.org #tag @someone"})
        async with client.post("/v1/webhooks/demo", data=body,
                               headers=standard(body, "msg_scenario")) as response:
            assert response.status == 202
            webhook_item = (await response.json())["item_id"]
        async with client.post("/v1/webhooks/demo", data=body,
                               headers=standard(body, "msg_scenario")) as response:
            assert response.status == 200
        # A GitHub delivery (the body's replay mark) and its replay under a fresh id.
        for delivery, status in (("gh-1", 202), ("gh-forged", 200)):
            async with client.post("/v1/webhooks/gh", data=body,
                                   headers=github(body, delivery)) as response:
                assert response.status == status
        async with client.post("/v1/jobs", json={"job_id": "scenario-job", "priority": "high",
                                                 "document": {"text": "alpha beta gamma"}}) as r:
            assert r.status == 202
        for item in (webhook_item, "scenario-job"):
            await wait_until(lambda item=item: _job_done(client, item), timeout=30,
                             message=f"{item} through all stages")

        # A bad signature feeds the brute-force barrier.
        async with client.post("/v1/webhooks/demo", data=body,
                               headers={**standard(body, "msg_bad"),
                                        "webhook-signature": "v1,AAAA"}) as response:
            assert response.status == 401

        # Telegram update, Slack event, Mattermost post: one reply each.
        update = text_update("hello bot", chat_id=4242)
        async with client.post("/telegram/webhook", json=update,
                               headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}) as r:
            assert r.status == 200
        await fake_telegram.wait_for_messages(1, chat_id=4242, timeout=15)
        mention = event_callback(event_type="app_mention", text="hi", event_id="EvScn")
        payload, headers = signed_json(SLACK_SECRET, mention)
        async with client.post("/slack/events", data=payload, headers=headers) as response:
            assert response.status == 200
        await fake_slack.wait_for_posts(1)
        await fake_mattermost.wait_for_sockets(1, timeout=15)
        channel = next(iter(fake_mattermost.channels))
        await fake_mattermost.create_post(channel, "hello mattermost")
        await fake_mattermost.wait_for_replies(1, channel_id=channel, timeout=15)

        # Feed, stream and a cached search.
        async with client.get("/v1/feed", params={"topic": "pipeline", "after": "0"}) as r:
            rows = (await r.json())["rows"]
            assert {row["kind"] for row in rows} == {"store", "chunk", "embed", "graph"}
        async with client.get("/v1/stream", params={"topics": "pipeline", "since": "pipeline:0"},
                              timeout=5) as response:
            assert response.status == 200
            first = await response.content.readline()
            assert first
        for _ in range(2):
            async with client.get("/v1/search", params={"q": "alpha"}) as response:
                results = (await response.json())["results"]
                assert any(r["item_id"] == "scenario-job" for r in results)
    finally:
        stop.set()
        await asyncio.wait_for(workers, 30)
        await rt.close()

    durable_keys = [k async for k in runtime.durable.scan_iter(count=1000)]
    cache_keys = [k async for k in runtime.cache.scan_iter(count=1000)]
    # The scenario really wrote to every namespace family it exercised.
    for prefix in ("q:", "dedup:webhook:", "dedup:job:", "dedup:telegram-update:",
                   "dedup:slack-event:", "dedup:mattermost-post:", "brute:", "rl:", "lock:"):
        assert any(k.startswith(prefix) for k in durable_keys), (prefix, durable_keys)
    for prefix in ("cache:", "telegram:active-conv:", "slack:active-conv:",
                   "mattermost:active-conv:"):
        assert any(k.startswith(prefix) for k in cache_keys), (prefix, cache_keys)
    assert await registry_violations(runtime.durable, "durable") == []
    assert await registry_violations(runtime.cache, "cache") == [], json.dumps(cache_keys)
