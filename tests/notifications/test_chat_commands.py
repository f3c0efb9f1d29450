"""A chat subscribes itself: ``/subscribe <topic>``, ``/unsubscribe <topic>``,
``/subscriptions`` (Slack ``/gw subscribe ...``; Mattermost also without the slash), for
linked chats only and only to topics the linked account may read; an unlinked chat is told
how to link. The subscription is the account's, and the chat receives the topic's rows."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from gateway.access.tokens import mint
from gateway.config import Secret
from gateway.conversations import links, subscribing
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app
from tests.access.test_links import say as say_in_chat
from tests.conversations.fast import with_sections
from tests.fakes import FakeSlack, FakeTelegram, slash_command_body
from tests.fakes.mattermost import BOT_USER_ID, FakeMattermost
from tests.fakes.pytest_plugin import SLACK_TOKEN, TELEGRAM_TOKEN
from tests.fakes.slack import CHANNEL_ID, signed_form
from tests.helpers import wait_until
from tests.inbound.mattermost.helpers import mattermost_settings
from tests.notifications.conftest import FAST, publish

SECRET = "chat-commands-secret-0123456789-0123456789"
SLACK_SIGNING = "slack-signing-secret"
SCOPES = frozenset({"feed:read", "subscriptions:write"})


def bearer(sub: str, topics: tuple[str, ...]) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint(SECRET, sub, SCOPES, topics)}"}


async def code_for(client: Any, sub: str, topics: tuple[str, ...]) -> str:
    async with client.post("/v1/auth/link-code", headers=bearer(sub, topics)) as issued:
        assert issued.status == 200, await issued.text()
        return str((await issued.json())["code"])


async def opened(runtime: Runtime, make_client: Any, *, deliver: bool = True,
                 **changes: Any) -> tuple[Any, Runtime]:
    settings = dataclasses.replace(
        with_sections(runtime.settings, notifications={**FAST, "deliver": deliver}),
        jwt_secret=Secret(SECRET), **changes)
    rt = await open_runtime(settings)
    return await make_client(create_app(rt), rt=rt), rt


async def say(rt: Runtime, chat: str, text: str, message_id: str) -> str:
    """The one reply a Telegram chat gets to ``text``."""
    [reply] = await say_in_chat(rt, chat, text, message_id)
    return reply


async def test_telegram_chat_subscribes_itself(
        runtime: Runtime, make_client: Any, fake_telegram: FakeTelegram) -> None:
    client, rt = await opened(runtime, make_client, telegram_bot_token=Secret(TELEGRAM_TOKEN),
                              telegram_webhook_secret=Secret("tg"),
                              telegram_api_url=fake_telegram.api_url)
    try:
        assert await say(rt, "77", "/subscribe alerts", "1") == subscribing.NOT_LINKED
        code = await code_for(client, "alice", ("alerts*", "conversation:*"))
        assert await say(rt, "77", f"/link {code}", "2") == links.LINKED
        assert await say(rt, "77", "/subscribe secrets", "3") == (
            "The account linked to this chat may not read secrets.")
        assert await say(rt, "77", "/subscribe alerts", "4") == (
            "Subscribed to alerts: its new events will show here.")
        assert await say(rt, "77", "/subscribe alerts", "5") == (
            "This chat is subscribed to alerts already.")
        assert (await say(rt, "77", "/subscribe bad!", "6")).startswith("topic")
        assert await say(rt, "77", "/subscriptions", "7") == (
            "This chat's subscriptions:\n- alerts")
        # The account sees it as its own.
        async with client.get("/v1/subscriptions", headers=bearer("alice", ())) as listed:
            [mine] = (await listed.json())["subscriptions"]
        assert (mine["topic"], mine["destination"]) == (
            "alerts", {"type": "telegram", "chat_id": "77"})
        await publish(client, "alerts", kind="cpu", text="high")
        await fake_telegram.wait_for_messages(1, 77, timeout=10)
        assert "[alerts] cpu: high" in fake_telegram.sent_texts(77)
        assert await say(rt, "77", "/unsubscribe alerts", "8") == "Unsubscribed from alerts."
        assert await say(rt, "77", "/unsubscribe alerts", "9") == (
            "This chat is not subscribed to alerts.")
        assert await say(rt, "77", "/subscriptions", "10") == "This chat has no subscriptions."
        # The commands were answered, not stored.
        texts = [r["text"] for r in await rt.pg.fetch("SELECT text FROM conversation_messages")]
        assert not any("subscri" in t for t in texts)
    finally:
        await rt.close()


async def test_a_chat_destination_through_the_api_needs_a_linked_chat(
        runtime: Runtime, make_client: Any) -> None:
    client, rt = await opened(runtime, make_client)
    try:
        code = await code_for(client, "alice", ("alerts",))
        assert await say(rt, "99", f"/link {code}", "1") == links.LINKED
        for chat, status in (("99", 201), ("100", 403)):
            async with client.post("/v1/subscriptions", headers=bearer("alice", ("alerts",)),
                                   json={"topic": "alerts", "destination": {
                                       "type": "telegram", "chat_id": chat}}) as made:
                assert made.status == status, await made.text()
    finally:
        await rt.close()


async def test_slack_gw_subscribe(runtime: Runtime, make_client: Any,
                                  fake_slack: FakeSlack) -> None:
    client, rt = await opened(runtime, make_client, slack_bot_token=Secret(SLACK_TOKEN),
                              slack_signing_secret=Secret(SLACK_SIGNING),
                              slack_api_url=fake_slack.api_url)

    async def gw(text: str, answered: int) -> str:
        body, headers = signed_form(SLACK_SIGNING, slash_command_body(
            "/gw", text, response_url=fake_slack.new_response_url()))
        async with client.post("/slack/commands", data=body, headers=headers) as response:
            assert response.status == 200
        return str((await fake_slack.wait_for_responses(answered, timeout=10))[-1]["text"])

    try:
        told = await gw("subscribe alerts", 1)
        assert "/gw link <code>" in told and "not linked" in told  # Slack's own form
        assert await gw(f"link {await code_for(client, 'alice', ('alerts',))}", 2) == (
            links.LINKED)
        assert (await gw("subscribe alerts", 3)).startswith("Subscribed to alerts")
        await publish(client, "alerts", text="disk full")
        await fake_slack.wait_for_posts(1, CHANNEL_ID, timeout=10)
        assert fake_slack.posted_texts(CHANNEL_ID) == ["[alerts] event: disk full"]
        assert await gw("subscriptions", 4) == "This chat's subscriptions:\n- alerts"
    finally:
        await rt.close()


async def test_mattermost_subscribe_without_the_slash(
        runtime: Runtime, make_client: Any, fake_mattermost: FakeMattermost) -> None:
    settings = mattermost_settings(dataclasses.replace(runtime.settings,
                                                       jwt_secret=Secret(SECRET)),
                                   fake_mattermost.url)
    settings = dataclasses.replace(settings, sections={**settings.sections,
                                                       "notifications": FAST})
    rt = await open_runtime(settings)
    try:
        client = await make_client(create_app(rt), rt=rt)
        await fake_mattermost.wait_for_sockets(1, timeout=10)
        await fake_mattermost.create_post("general", "subscribe alerts")
        [told] = await fake_mattermost.wait_for_replies(1, "general", timeout=10)
        assert "send link <code> here; then subscribe <topic>" in told["message"]
        await fake_mattermost.create_post(
            "general", f"link {await code_for(client, 'alice', ('alerts',))}")
        await fake_mattermost.create_post("general", "subscribe alerts")
        replies = await fake_mattermost.wait_for_replies(3, "general", timeout=10)
        assert replies[2]["message"].startswith("Subscribed to alerts")
        await publish(client, "alerts", text="cpu high")

        def delivered() -> bool:
            return any(r["message"] == "[alerts] event: cpu high"
                       for r in fake_mattermost.replies("general"))

        await wait_until(delivered, timeout=10, message="the row posted in the channel")
        [post] = [r for r in fake_mattermost.replies("general")
                  if r["message"] == "[alerts] event: cpu high"]
        assert post["props"]["gateway_notification"].endswith(":alerts:1:1")
    finally:
        await rt.close()


async def test_a_posted_message_is_found_on_mattermost_and_not_posted_again(
        runtime: Runtime, make_client: Any, fake_mattermost: FakeMattermost) -> None:
    """As on Slack (test_chats): the mark of a message whose holder stopped after posting it
    is found in the channel's posts (its props), and the rows it covered are not posted
    again by the next holder."""
    maker, maker_rt = await opened(runtime, make_client, deliver=False)
    async with maker.post("/v1/subscriptions", json={
            "topic": "mm", "template": "{text}",
            "destination": {"type": "mattermost", "channel_id": "general"}}) as created:
        sub = (await created.json())["id"]
    await publish(maker, "mm", text="one")
    mark = f"{sub}:mm:1:1"
    await runtime.pg.execute("UPDATE subscriptions SET sending = $2 WHERE id = $1", sub,
                             {"topic": "mm", "to": 1, "epoch": 1, "mark": mark,
                              "at": time.time()})
    fake_mattermost.make_post("general", "one", user_id=BOT_USER_ID,  # as the bot posted it
                              props={"gateway_notification": mark})
    settings = mattermost_settings(runtime.settings, fake_mattermost.url)
    settings = dataclasses.replace(settings, sections={**settings.sections,
                                                       "notifications": FAST})
    rt = await open_runtime(settings)
    try:
        client = await make_client(create_app(rt), rt=rt)
        await publish(client, "mm", text="two")

        def posted() -> list[str]:
            return [r["message"] for r in fake_mattermost.replies("general")]

        await wait_until(lambda: posted() == ["two"], timeout=10, message="only row 2 posted")
    finally:
        await rt.close()
        await maker_rt.close()
