"""Chat links: an account asks for a code, the chat sends ``/link <code>`` (Telegram;
``/gw link <code>`` on Slack's slash command, ``link <code>`` on Mattermost), and the account
then reads that chat's conversations (nobody else does); wrong codes are limited per chat;
links are listed and removed, and a removal ends the streams that read through it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.access.tokens import mint
from gateway.config import Secret, Settings
from gateway.conversations import links
from gateway.conversations.model import Incoming
from gateway.conversations.service import service_for
from gateway.push.web import HUB
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app
from tests.conversations.fast import with_sections
from tests.fakes import FakeSlack, event_callback, slash_command_body
from tests.fakes.mattermost import FakeMattermost
from tests.fakes.pytest_plugin import SLACK_TOKEN
from tests.fakes.slack import CHANNEL_ID, signed_form, signed_json
from tests.helpers import registry_violations, wait_until
from tests.inbound.mattermost.helpers import mattermost_settings

SECRET = "links-test-secret-0123456789-0123456789"
SLACK_SIGNING = "slack-signing-secret"


def bearer(sub: str, topics: tuple[str, ...] = ()) -> dict[str, str]:
    token = mint(SECRET, sub, frozenset({"feed:read"}), topics)
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def rt(runtime: Runtime, settings: Settings) -> AsyncIterator[Runtime]:
    opened = await open_runtime(dataclasses.replace(with_sections(settings),
                                                    jwt_secret=Secret(SECRET)))
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def client(rt: Runtime, make_client: Callable[..., Any]) -> TestClient[Any, Any]:
    return await make_client(create_app(rt), rt=rt)  # type: ignore[no-any-return]


async def say(rt: Runtime, chat: str, text: str, message_id: str) -> list[str]:
    sent: list[str] = []

    async def send(reply: str) -> None:
        sent.append(reply)

    await service_for(rt).handle_leased(Incoming(
        platform="telegram", chat=chat, thread=None, user_id="u1", user_name="user",
        text=text, message_id=message_id), send)
    return sent


async def feed_status(client: TestClient[Any, Any], conversation: int,
                      headers: dict[str, str]) -> int:
    async with client.get(f"/v1/feed?topic=conversation:{conversation}",
                          headers=headers) as response:
        return response.status


async def test_a_linked_chat_is_readable_by_its_account_only(
        rt: Runtime, client: TestClient[Any, Any]) -> None:
    await say(rt, "555", "hello before the link", "1")
    conversation = await rt.pg.fetchval("SELECT id FROM conversations WHERE chat = '555'")
    assert await feed_status(client, conversation, bearer("alice")) == 403
    async with client.post("/v1/auth/link-code", headers=bearer("alice")) as issued:
        assert issued.status == 200
        code = (await issued.json())["code"]
    assert await say(rt, "555", f"/link {code}", "2") == [links.LINKED]
    assert await feed_status(client, conversation, bearer("alice")) == 200
    assert await feed_status(client, conversation, bearer("bob")) == 403
    texts = [r["text"] for r in await rt.pg.fetch("SELECT text FROM conversation_messages")]
    assert not any(code in text for text in texts)  # the code never reached the record
    assert await say(rt, "555", f"/link {code}", "3") == [links.WRONG]  # one use
    async with client.get("/v1/auth/links", headers=bearer("alice")) as listed:
        [link] = (await listed.json())["links"]
        assert (link["platform"], link["chat"]) == ("telegram", "555")
    async with client.delete(f"/v1/auth/links/{link['id']}", headers=bearer("bob")) as theirs:
        assert theirs.status == 404  # not bob's to remove
    async with client.delete(f"/v1/auth/links/{link['id']}", headers=bearer("alice")) as gone:
        assert gone.status == 200
    assert await feed_status(client, conversation, bearer("alice")) == 403


async def stream_reason(client: TestClient[Any, Any], topic: str,
                        headers: dict[str, str]) -> str:
    async with client.get(f"/v1/stream?topics={topic}", headers=headers) as response:
        assert response.status == 200
        async for line in response.content:
            if line.startswith(b"data: ") and b'"reason"' in line:
                return str(json.loads(line[6:])["reason"])
    raise AssertionError("the stream ended without gateway.disconnect")


async def test_removing_a_link_ends_the_streams_reading_through_it(
        rt: Runtime, client: TestClient[Any, Any], settings: Settings,
        make_client: Callable[..., Any]) -> None:
    """The stream is on another replica than the DELETE: it learns of the removal from
    bl:link:<sub> and ends (forbidden) within the 5 s bound; a stream reading by its own
    topic patterns is not touched."""
    await say(rt, "888", "hello", "1")
    conversation = await rt.pg.fetchval("SELECT id FROM conversations WHERE chat = '888'")
    async with client.post("/v1/auth/link-code", headers=bearer("alice")) as issued:
        code = (await issued.json())["code"]
    assert await say(rt, "888", f"/link {code}", "2") == [links.LINKED]
    other_rt = await open_runtime(dataclasses.replace(with_sections(settings),
                                                      jwt_secret=Secret(SECRET)))
    try:
        replica = await make_client(create_app(other_rt), rt=other_rt)
        topic = f"conversation:{conversation}"
        linked = asyncio.create_task(stream_reason(replica, topic, bearer("alice")))
        own = asyncio.create_task(stream_reason(replica, topic, bearer("bob", (topic,))))
        hub = replica.server.app[HUB]
        await wait_until(lambda: hub.subscriber_count == 2, timeout=5, message="streams open")
        async with client.get("/v1/auth/links", headers=bearer("alice")) as listed:
            [link] = (await listed.json())["links"]
        async with client.delete(f"/v1/auth/links/{link['id']}",
                                 headers=bearer("alice")) as gone:
            assert gone.status == 200
        started = time.monotonic()
        async with asyncio.timeout(6):
            assert await linked == "forbidden"
        assert time.monotonic() - started <= 5
        assert await feed_status(client, conversation, bearer("alice")) == 403
        assert not own.done() and hub.subscriber_count >= 1  # bob reads it by his pattern
        own.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await own
        assert await registry_violations(rt.durable, "durable") == []
    finally:
        await other_rt.close()


async def test_wrong_codes_are_limited_per_chat(rt: Runtime,
                                                client: TestClient[Any, Any]) -> None:
    async with client.post("/v1/auth/link-code", headers=bearer("alice")) as issued:
        code = (await issued.json())["code"]
    wrong = "00000000" if code != "00000000" else "11111111"
    replies = [(await say(rt, "666", f"/link {wrong}", str(n)))[0] for n in range(5)]
    assert replies == [links.WRONG] * 4 + [links.BLOCKED]
    assert await say(rt, "666", f"/link {code}", "9") == [links.BLOCKED]  # even the right one
    assert await say(rt, "777", f"/link {code}", "1") == [links.LINKED]  # other chats are not
    assert await registry_violations(rt.durable, "durable") == []


async def test_links_need_an_account(client: TestClient[Any, Any]) -> None:
    async with client.post("/v1/auth/link-code") as admin:  # the admin token has no sub
        assert admin.status == 403


async def link_code(client: TestClient[Any, Any], sub: str = "alice") -> str:
    async with client.post("/v1/auth/link-code", headers=bearer(sub)) as issued:
        assert issued.status == 200
        return str((await issued.json())["code"])


async def test_slack_gw_link_links_the_channel(
        settings: Settings, runtime: Runtime, fake_slack: FakeSlack,
        make_client: Callable[..., Any]) -> None:
    """``/gw link <code>`` through the signed slash-command route, answered at its
    response_url; the channel's conversation is then alice's to read."""
    rt = await open_runtime(dataclasses.replace(
        with_sections(settings), jwt_secret=Secret(SECRET), slack_bot_token=Secret(SLACK_TOKEN),
        slack_signing_secret=Secret(SLACK_SIGNING), slack_api_url=fake_slack.api_url))
    try:
        client = await make_client(create_app(rt), rt=rt)
        body, headers = signed_json(SLACK_SIGNING, event_callback(event_type="app_mention",
                                                                   text="hello"))
        async with client.post("/slack/events", data=body, headers=headers) as mention:
            assert mention.status == 200
        await fake_slack.wait_for_posts(1, CHANNEL_ID)
        conversation = await rt.pg.fetchval(
            "SELECT id FROM conversations WHERE platform = 'slack' AND chat = $1", CHANNEL_ID)
        assert await feed_status(client, conversation, bearer("alice")) == 403
        code = await link_code(client)
        for sent in (1, 2):  # the same code twice: linked, then refused (one use)
            body, headers = signed_form(SLACK_SIGNING, slash_command_body(
                "/gw", f"link {code}", response_url=fake_slack.new_response_url()))
            async with client.post("/slack/commands", data=body, headers=headers) as command:
                assert command.status == 200
            responses = await fake_slack.wait_for_responses(sent)
        assert responses[0]["text"] == links.LINKED
        assert responses[1]["text"].startswith("That code is not valid")
        assert "/gw link <code>" in responses[1]["text"]  # told in Slack's own form
        assert await feed_status(client, conversation, bearer("alice")) == 200
        assert await feed_status(client, conversation, bearer("bob")) == 403
        texts = [r["text"] for r in await rt.pg.fetch("SELECT text FROM conversation_messages")]
        assert not any(code in text for text in texts)
    finally:
        await rt.close()


async def test_mattermost_link_without_the_slash(
        settings: Settings, runtime: Runtime, fake_mattermost: FakeMattermost,
        make_client: Callable[..., Any]) -> None:
    """Mattermost clients take a leading / as their own slash command: ``link <code>`` links
    the channel; ``/link <code>`` (a message posted through the API) does too; "link me to
    the docs" stays a message."""
    rt = await open_runtime(dataclasses.replace(
        mattermost_settings(with_sections(settings), fake_mattermost.url),
        jwt_secret=Secret(SECRET)))
    try:
        client = await make_client(create_app(rt), rt=rt)  # runs the listener and consumer
        await fake_mattermost.wait_for_sockets(1, timeout=10)
        await fake_mattermost.create_post("general", "hello")
        await fake_mattermost.create_post("random", "hello too")
        await fake_mattermost.wait_for_replies(2, timeout=10)
        ids = {r["chat"]: r["id"] for r in await rt.pg.fetch(
            "SELECT chat, id FROM conversations WHERE platform = 'mattermost'")}
        assert await feed_status(client, ids["general"], bearer("alice")) == 403
        await fake_mattermost.create_post("general", f"link {await link_code(client)}")
        await fake_mattermost.create_post("random", f"/link {await link_code(client)}")
        await fake_mattermost.create_post("general", "link me to the docs")
        replies = await fake_mattermost.wait_for_replies(5, timeout=10)
        assert [r["message"] for r in replies[2:4]] == [links.LINKED, links.LINKED]
        assert links.LINKED not in replies[4]["message"]  # an ordinary message, answered
        for chat in ("general", "random"):
            assert await feed_status(client, ids[chat], bearer("alice")) == 200
            assert await feed_status(client, ids[chat], bearer("bob")) == 403
        texts = [r["text"] for r in await rt.pg.fetch("SELECT text FROM conversation_messages")]
        assert "link me to the docs" in texts
        assert not any(t.startswith(("link ", "/link ")) and t != "link me to the docs"
                       for t in texts)
    finally:
        await rt.close()



async def test_a_pending_code_is_never_handed_to_another_account(
        rt: Runtime, client: TestClient[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Bob draws the 8 digits of Alice's pending code: he gets another code, and the chat
    that sends Alice's code is linked to Alice, not to Bob."""
    draws = iter([12345678, 12345678, 87654321])
    monkeypatch.setattr(links, "secrets", SimpleNamespace(randbelow=lambda _: next(draws)))
    async with client.post("/v1/auth/link-code", headers=bearer("alice")) as first:
        assert (await first.json())["code"] == "12345678"
    async with client.post("/v1/auth/link-code", headers=bearer("bob")) as collided:
        assert collided.status == 200 and (await collided.json())["code"] == "87654321"
    assert await say(rt, "777", "/link 12345678", "1") == [links.LINKED]
    rows = await rt.pg.fetch("SELECT sub, chat_key FROM chat_links")
    assert [(r["sub"], r["chat_key"]) for r in rows] == [("alice", "777")]


async def test_link_codes_are_limited_per_account(rt: Runtime,
                                                  client: TestClient[Any, Any]) -> None:
    """20 codes an hour per account ([access] link_codes_per_hour), then 429 + Retry-After;
    another account is not affected."""
    for _ in range(20):
        async with client.post("/v1/auth/link-code", headers=bearer("mallory")) as issued:
            assert issued.status == 200
    async with client.post("/v1/auth/link-code", headers=bearer("mallory")) as refused:
        assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
    async with client.post("/v1/auth/link-code", headers=bearer("alice")) as other:
        assert other.status == 200
    assert await rt.pg.fetchval("SELECT count(*) FROM link_codes WHERE sub = 'mallory'") == 20
    assert await registry_violations(rt.durable, "durable") == []
