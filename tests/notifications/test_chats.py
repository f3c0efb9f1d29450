"""Chat destinations on the platform fakes: a row becomes a message from the template,
through the platform limits; rows arriving faster than the chat may take messages go out as
digests (every row's line, in order, none twice, cut to the platform's message size); a
message whose holder stopped after posting it is found on the platform (Slack metadata,
Mattermost props) and not posted again."""

from __future__ import annotations

import dataclasses
import itertools
import re
import time
from typing import Any

import pytest

from gateway.config import Secret
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app
from tests.fakes import FakeSlack, FakeTelegram
from tests.fakes.pytest_plugin import SLACK_TOKEN, TELEGRAM_TOKEN
from tests.fakes.slack import CHANNEL_ID
from tests.helpers import wait_until
from tests.notifications.conftest import FAST, publish

CHAT = 4242
HEADER = re.compile(r"^(\d+) new on (\S+):$")


def lines_of(messages: list[str]) -> list[str]:
    """The row lines the chat saw, digests unpacked (their header's count checked)."""
    seen: list[str] = []
    for text in messages:
        first, _, rest = text.partition("\n")
        header = HEADER.match(first)
        if header is None:
            seen.append(text)
            continue
        body = rest.split("\n")
        assert int(header.group(1)) == len(body), text
        seen += body
    return seen


@pytest.fixture
async def chats(runtime: Runtime, make_client: Any, fake_telegram: FakeTelegram,
                fake_slack: FakeSlack) -> Any:
    """``await chats(**[notifications] changes)`` → a client on an app with Telegram and
    Slack pointed at their fakes, delivering fast, the platforms' own limits kept."""
    runtimes: list[Runtime] = []

    async def start(**notifications: Any) -> Any:
        settings = dataclasses.replace(
            runtime.settings, telegram_bot_token=Secret(TELEGRAM_TOKEN),
            telegram_webhook_secret=Secret("tg-secret"), telegram_api_url=fake_telegram.api_url,
            slack_bot_token=Secret(SLACK_TOKEN), slack_signing_secret=Secret("slack-secret"),
            slack_api_url=fake_slack.api_url,
            sections={"notifications": {**FAST, **notifications}})
        rt = await open_runtime(settings)
        runtimes.append(rt)
        return await make_client(create_app(rt), rt=rt)

    yield start
    for rt in runtimes:
        await rt.close()


async def chat_subscription(client: Any, topic: str, destination: dict[str, Any],
                            **fields: Any) -> dict[str, Any]:
    response = await client.post("/v1/subscriptions", json={
        "topic": topic, "destination": destination, **fields})
    assert response.status == 201, await response.text()
    return dict(await response.json())


async def test_rows_become_messages_and_a_burst_becomes_digests(
        chats: Any, fake_telegram: FakeTelegram) -> None:
    client = await chats()
    await chat_subscription(client, "deploys", {"type": "telegram", "chat_id": CHAT},
                            template="{kind}: {text} ({data.env})")
    await publish(client, "deploys", kind="deploy", text="v1", data={"env": "prod"})
    await fake_telegram.wait_for_messages(1, CHAT, timeout=10)
    assert fake_telegram.sent_texts(CHAT) == ["deploy: v1 (prod)"]
    for n in range(2, 12):  # ten rows at once: far faster than 1 message/s per chat
        await publish(client, "deploys", kind="deploy", text=f"v{n}", data={"env": "prod"})

    expected = [f"deploy: v{n} (prod)" for n in range(1, 12)]
    await wait_until(lambda: lines_of(fake_telegram.sent_texts(CHAT)) == expected,
                     timeout=15, message="every row's line, once, in order")
    texts = fake_telegram.sent_texts(CHAT)
    assert len(texts) <= 4, texts  # digests, not a message per row
    assert any(HEADER.match(t.split("\n")[0]) for t in texts)
    times = [c.time for c in fake_telegram.calls_to("sendMessage")]
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(times)), times


async def test_a_digest_is_cut_to_the_platforms_message_size(
        chats: Any, fake_telegram: FakeTelegram) -> None:
    client = await chats()
    await chat_subscription(client, "big", {"type": "telegram", "chat_id": CHAT},
                            template="{text}")
    texts = [f"{n}:" + "x" * 1500 for n in range(9)]
    for text in texts:
        await publish(client, "big", text=text)
    await wait_until(lambda: lines_of(fake_telegram.sent_texts(CHAT)) == texts, timeout=20,
                     message="all nine long rows, in order, none twice")
    sent = fake_telegram.sent_texts(CHAT)
    assert all(len(t) <= 4096 for t in sent)
    assert max(len(lines_of([t])) for t in sent) == 2  # two 1,500-character lines fit 4,096


async def test_a_posted_message_is_found_on_slack_and_not_posted_again(
        chats: Any, fake_slack: FakeSlack, runtime: Runtime) -> None:
    """The holder posted the message of row 1 and stopped before moving the cursor (its
    mark is still set): the next holder finds the message by its mark and goes on at row 2.
    A mark with no message on the platform (the post never arrived) is posted once."""
    maker = await chats(deliver=False)
    made = await chat_subscription(maker, "s", {"type": "slack", "channel": CHANNEL_ID},
                                   template="{text}")
    other = await chat_subscription(maker, "s2", {"type": "slack", "channel": "C2"},
                                    template="{text}")
    await publish(maker, "s", text="one")
    await publish(maker, "s2", text="uno")
    for sub, topic in ((made, "s"), (other, "s2")):
        await runtime.pg.execute(
            "UPDATE subscriptions SET sending = $2 WHERE id = $1", sub["id"],
            {"topic": topic, "to": 1, "epoch": 1, "mark": f"{sub['id']}:{topic}:1:1",
             "at": time.time()})
    fake_slack.add_message(CHANNEL_ID, "one", metadata={
        "event_type": "gateway_notification",
        "event_payload": {"mark": f"{made['id']}:s:1:1"}})
    client = await chats()
    await publish(client, "s", text="two")
    await fake_slack.wait_for_posts(1, CHANNEL_ID, timeout=10)
    await fake_slack.wait_for_posts(1, "C2", timeout=10)
    await publish(client, "s", text="three")
    await fake_slack.wait_for_posts(2, CHANNEL_ID, timeout=10)
    assert fake_slack.posted_texts(CHANNEL_ID) == ["two", "three"]
    assert fake_slack.posted_texts("C2") == ["uno"]
    posted = fake_slack.posted_messages(CHANNEL_ID)[0]
    assert posted["metadata"]["event_payload"]["mark"] == f"{made['id']}:s:1:2"
