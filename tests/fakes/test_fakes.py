"""The fakes work with the real client libraries over loopback.

These tests pin the behaviour other tests rely on: PTB, slack_sdk/slack_bolt
and a plain aiohttp Mattermost client talk to the fakes unchanged, calls are
recorded, and injected faults surface as the libraries' own exceptions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest
import pytest_asyncio
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient
from telegram import Message, Update
from telegram.error import BadRequest, Conflict, InvalidToken, NetworkError, RetryAfter
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from gateway.outbound.errors import retry_after_of
from tests.fakes.mattermost import HUMAN_USER_ID, FakeMattermost
from tests.fakes.slack import (
    BOT_USER_ID,
    FakeSlack,
    event_callback,
    sign_slack,
    signed_form,
    signed_json,
    slash_command_body,
)
from tests.fakes.telegram import FakeTelegram, text_update
from tests.fakes.waiting import wait_until

TG_TOKEN = "123456:TEST-token"
SLACK_TOKEN = "xoxb-test"
SLACK_SECRET = "slack-signing-secret"
MM_TOKEN = "mm-token"

logging.getLogger("httpx").setLevel(logging.WARNING)  # keeps the bot token out of logs


@pytest_asyncio.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TG_TOKEN) as fake:
        yield fake


@pytest_asyncio.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(token=SLACK_TOKEN) as fake:
        yield fake


@pytest_asyncio.fixture
async def mm() -> AsyncIterator[FakeMattermost]:
    async with FakeMattermost(token=MM_TOKEN) as fake:
        yield fake


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


def bolt_request(body: bytes, headers: Mapping[str, str]) -> AsyncBoltRequest:
    hdrs: dict[str, str | Sequence[str]] = dict(headers)
    return AsyncBoltRequest(body=body.decode(), headers=hdrs)


def ptb_app(
    fake: FakeTelegram, *, polling: bool = False
) -> Application[Any, Any, Any, Any, Any, Any]:
    builder = Application.builder().token(TG_TOKEN).base_url(f"{fake.api_url}/bot")
    if not polling:
        builder = builder.updater(None)
    return builder.build()


# --- waiting -----------------------------------------------------------------------


async def test_wait_until_sync_async_and_timeout() -> None:
    box: list[int] = []
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, box.append, 1)
    assert await wait_until(lambda: len(box), timeout=2) == 1

    async def ready() -> str:
        return "yes" if box else ""

    assert await wait_until(ready, timeout=1) == "yes"
    started = loop.time()
    with pytest.raises(AssertionError, match="never true"):
        await wait_until(lambda: False, timeout=0.1, message="never true")
    assert loop.time() - started < 1.0


# --- Telegram ----------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::telegram.warnings.PTBDeprecationWarning")
async def test_telegram_ptb_send_message_and_faults(tg: FakeTelegram) -> None:
    app = ptb_app(tg)
    await app.initialize()
    try:
        assert app.bot.username == tg.bot_user["username"]
        message = await app.bot.send_message(chat_id=777, text="hello")
        assert message.text == "hello" and message.chat.id == 777
        assert tg.sent_messages(chat_id=777) == [{"chat_id": "777", "text": "hello"}]
        assert tg.sent_texts() == ["hello"]
        assert tg.calls_to("sendMessage")[0].token == TG_TOKEN

        tg.fail_next("sendMessage", status=429, retry_after=3)
        with pytest.raises(RetryAfter) as info:
            await app.bot.send_message(chat_id=777, text="flood")
        assert retry_after_of(info.value) == 3.0  # an int or a timedelta (PTB_TIMEDELTA)

        tg.fail_next("sendMessage", status=500, count=2)
        for _ in range(2):
            with pytest.raises(NetworkError):
                await app.bot.send_message(chat_id=777, text="boom")
        await app.bot.send_message(chat_id=-100123, text="recovered")
        assert tg.sent_texts(-100123) == ["recovered"]
        assert tg.method_names()[0] == "getMe"
    finally:
        await app.shutdown()


@pytest.mark.filterwarnings("ignore::telegram.warnings.PTBDeprecationWarning")
async def test_telegram_edits_typing_and_not_modified(tg: FakeTelegram) -> None:
    app = ptb_app(tg)
    await app.initialize()
    try:
        assert await app.bot.send_chat_action(chat_id=777, action="typing")
        assert [c.params["action"] for c in tg.chat_actions(777)] == ["typing"]
        first = await app.bot.send_message(chat_id=777, text="Hel")
        edited = await app.bot.edit_message_text("Hello", chat_id=777,
                                                 message_id=first.message_id)
        assert isinstance(edited, Message) and edited.message_id == first.message_id
        assert edited.text == "Hello"
        with pytest.raises(BadRequest, match="not modified"):  # as Telegram answers
            await app.bot.edit_message_text("Hello", chat_id=777, message_id=first.message_id)
        with pytest.raises(BadRequest, match="not found"):
            await app.bot.edit_message_text("x", chat_id=777, message_id=9999)
        with pytest.raises(BadRequest, match="too long"):
            await app.bot.edit_message_text("x" * 4097, chat_id=777,
                                            message_id=first.message_id)
        await app.bot.send_message(chat_id=778, text="elsewhere")
        assert tg.shown(777) == [["Hel", "Hello"]] and tg.shown(778) == [["elsewhere"]]
        assert len(tg.edits(777)) == 4  # refused ones are recorded too
    finally:
        await app.shutdown()


async def test_telegram_wrong_token_is_unauthorized(tg: FakeTelegram) -> None:
    app = (
        Application.builder().token("999:wrong").base_url(f"{tg.api_url}/bot").updater(None).build()
    )
    with pytest.raises(InvalidToken):
        await app.initialize()


async def test_telegram_webhook_methods(tg: FakeTelegram) -> None:
    app = ptb_app(tg)
    await app.initialize()
    try:
        assert await app.bot.set_webhook(
            "https://example.invalid/telegram/webhook", secret_token="s3cr3t"
        )
        assert tg.webhook_url == "https://example.invalid/telegram/webhook"
        assert tg.webhook["secret_token"] == "s3cr3t"
        info = await app.bot.get_webhook_info()
        assert info.url == tg.webhook_url
        with pytest.raises(Conflict):
            await app.bot.get_updates(timeout=0)
        assert await app.bot.delete_webhook()
        assert tg.webhook_url == ""
    finally:
        await app.shutdown()


async def test_telegram_webhook_delivery_helper(tg: FakeTelegram) -> None:
    from aiohttp import web

    got: list[tuple[str, dict[str, Any]]] = []

    async def hook(request: web.Request) -> web.Response:
        got.append(
            (request.headers.get("X-Telegram-Bot-Api-Secret-Token", ""), await request.json())
        )
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        tg.webhook = {"url": f"http://127.0.0.1:{port}/hook", "secret_token": "tok"}
        update = text_update("hi", update_id=42)
        assert await tg.deliver_webhook(update) == 200
        assert got == [("tok", update)]
    finally:
        await runner.cleanup()


async def test_telegram_get_updates_long_poll_raw(
    tg: FakeTelegram, http: aiohttp.ClientSession
) -> None:
    url = f"{tg.api_url}/bot{TG_TOKEN}/getUpdates"
    loop = asyncio.get_running_loop()

    started = loop.time()
    async with http.post(url, data={"timeout": "0.2"}) as resp:
        assert (await resp.json()) == {"ok": True, "result": []}
    assert 0.15 <= loop.time() - started < 2.0  # honoured the timeout

    poll = asyncio.ensure_future(http.post(url, json={"timeout": 10, "offset": 0}))
    await tg.wait_for_calls("getUpdates", count=2)
    first = tg.push_update(text_update("one"))
    resp = await asyncio.wait_for(poll, 5)  # returns as soon as an update exists
    body = await resp.json()
    resp.release()
    assert [u["update_id"] for u in body["result"]] == [first]

    second = tg.push_update({"message": text_update("two")["message"]})
    assert second == first + 1
    async with http.post(url, data={"offset": str(first + 1), "timeout": "0"}) as resp:
        assert [u["update_id"] for u in (await resp.json())["result"]] == [second]
    assert [u["update_id"] for u in tg.pending_updates] == [second]  # first confirmed

    # a newer poll terminates an older one with 409, as Telegram does
    old = asyncio.ensure_future(http.post(url, data={"offset": str(second + 1), "timeout": "10"}))
    await tg.wait_for_calls("getUpdates", count=4)
    async with http.post(url, data={"offset": str(second + 1), "timeout": "0"}) as resp:
        assert (await resp.json())["result"] == []
    resp = await asyncio.wait_for(old, 5)
    assert resp.status == 409
    resp.release()


async def test_telegram_polling_with_ptb_updater(tg: FakeTelegram) -> None:
    app = ptb_app(tg, polling=True)

    async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.message is not None
        await update.message.reply_text(f"echo: {update.message.text}")

    app.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, echo))
    await app.initialize()
    assert app.updater is not None
    await app.updater.start_polling(timeout=2, poll_interval=0)
    await app.start()
    try:
        tg.push_update(text_update("hi", chat_id=555, update_id=5001))
        tg.push_update(text_update("again", chat_id=555, update_id=5002))
        sent = await tg.wait_for_messages(2, chat_id=555)
        assert [m["text"] for m in sent] == ["echo: hi", "echo: again"]
    finally:
        await app.updater.stop()
        await app.stop()
        await app.shutdown()
    assert "deleteWebhook" in tg.method_names()
    assert tg.pending_updates == []  # the final confirm call consumed them
    offsets = [c.params.get("offset") for c in tg.get_updates_calls()]
    assert "5003" in offsets


async def test_telegram_close_ends_pending_long_poll(http: aiohttp.ClientSession) -> None:
    fake = await FakeTelegram().start()
    url = f"{fake.api_url}/bot1:x/getUpdates"
    poll = asyncio.ensure_future(http.post(url, data={"timeout": "60"}))
    await fake.wait_for_calls("getUpdates")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await fake.close()
    assert loop.time() - started < 2.0
    resp = await asyncio.wait_for(poll, 5)
    resp.release()


# --- Slack -------------------------------------------------------------------------


async def test_slack_web_client_post_and_rate_limit(slack: FakeSlack) -> None:
    client = AsyncWebClient(token=SLACK_TOKEN, base_url=slack.api_url)
    auth = await client.auth_test()
    assert auth["team_id"] == slack.team_id and auth["user_id"] == slack.user_id
    assert auth["bot_id"] == slack.bot_id

    first = await client.chat_postMessage(channel="C1", text="hello")
    await client.chat_postMessage(channel="C1", text="in thread", thread_ts=first["ts"])
    posted = slack.posted_messages("C1")
    assert [(p["channel"], p["text"], p.get("thread_ts")) for p in posted] == [
        ("C1", "hello", None),
        ("C1", "in thread", first["ts"]),
    ]
    assert slack.calls_to("chat.postMessage")[0].token == SLACK_TOKEN
    replies = await client.conversations_replies(channel="C1", ts=first["ts"])
    assert [m["text"] for m in replies["messages"]] == ["hello", "in thread"]

    slack.fail_next("chat.postMessage", status=429, retry_after=2)
    with pytest.raises(SlackApiError) as info:
        await client.chat_postMessage(channel="C1", text="flood")
    assert info.value.response.status_code == 429
    assert info.value.response["error"] == "ratelimited"
    assert info.value.response.headers["Retry-After"] == "2"

    slack.fail_next("chat.postMessage", status=200, error="channel_not_found")
    with pytest.raises(SlackApiError) as info:
        await client.chat_postMessage(channel="C404", text="x")
    assert info.value.response["error"] == "channel_not_found"

    bad = AsyncWebClient(token="xoxb-wrong", base_url=slack.api_url)
    with pytest.raises(SlackApiError) as info:
        await bad.auth_test()
    assert info.value.response["error"] == "invalid_auth"


async def test_slack_chat_update(slack: FakeSlack) -> None:
    client = AsyncWebClient(token=SLACK_TOKEN, base_url=slack.api_url)
    first = await client.chat_postMessage(channel="C1", text="Hel")
    updated = await client.chat_update(channel="C1", ts=first["ts"], text="Hello")
    assert updated["ts"] == first["ts"] and updated["text"] == "Hello"
    history = await client.conversations_history(channel="C1")
    assert [m["text"] for m in history["messages"]] == ["Hello"]
    for ts, text, error in ((first["ts"], "x" * 40_001, "msg_too_long"),
                            ("1.000001", "x", "message_not_found")):
        with pytest.raises(SlackApiError) as info:
            await client.chat_update(channel="C1", ts=ts, text=text)
        assert info.value.response["error"] == error
    seeded = slack.add_message("C1", "a user's words")
    with pytest.raises(SlackApiError) as info:
        await client.chat_update(channel="C1", ts=seeded["ts"], text="not yours")
    assert info.value.response["error"] == "cant_update_message"
    assert slack.shown("C1") == [["Hel", "Hello"]]  # the bot's messages only
    assert len(slack.updates("C1")) == 4


async def test_slack_form_body_and_response_url(
    slack: FakeSlack, http: aiohttp.ClientSession
) -> None:
    async with http.post(
        f"{slack.api_url}chat.postMessage",
        data={"channel": "C2", "text": "form", "token": SLACK_TOKEN},
    ) as resp:
        assert (await resp.json())["ok"] is True
    assert slack.posted_texts("C2") == ["form"]

    url = slack.new_response_url("abc")
    result = await AsyncWebhookClient(url).send(text="done")
    assert result.status_code == 200
    assert slack.responses("abc") == [{"text": "done", "_response_id": "abc"}]


def test_slack_signing_and_builders() -> None:
    body, headers = signed_json(SLACK_SECRET, event_callback(text="hi", event_id="Ev1"))
    assert SignatureVerifier(SLACK_SECRET).is_valid_request(body, headers)
    payload = json.loads(body)
    assert payload["type"] == "event_callback" and payload["event_id"] == "Ev1"
    assert payload["event"]["type"] == "message" and payload["event"]["text"] == "hi"

    mention = event_callback(event_type="app_mention", text="help")
    assert mention["event"]["text"] == f"<@{BOT_USER_ID}> help"
    assert mention["event_id"] != event_callback()["event_id"]

    old = sign_slack(SLACK_SECRET, b"x", timestamp=int(time.time()) - 301)
    assert not SignatureVerifier(SLACK_SECRET).is_valid_request(b"x", old)

    form, form_headers = signed_form(SLACK_SECRET, slash_command_body("/gw", "run it"))
    assert SignatureVerifier(SLACK_SECRET).is_valid_request(form, form_headers)
    fields = parse_qs(form.decode())
    assert fields["command"] == ["/gw"] and fields["text"] == ["run it"]


async def test_slack_bolt_end_to_end_with_builders(slack: FakeSlack) -> None:
    bolt = AsyncApp(
        signing_secret=SLACK_SECRET,
        client=AsyncWebClient(token=SLACK_TOKEN, base_url=slack.api_url),
        process_before_response=True,
    )

    @bolt.event("message")
    async def on_message(event: dict[str, Any], say: Any) -> None:
        await say(text=f"echo: {event['text']}")

    @bolt.command("/gw")
    async def on_command(ack: Any, command: dict[str, Any], respond: Any) -> None:
        await ack("working")
        await respond(f"done: {command['text']}")

    body, headers = signed_json(SLACK_SECRET, event_callback(text="hey", channel="C9"))
    response = await bolt.async_dispatch(bolt_request(body, headers))
    assert response.status == 200
    assert slack.posted_texts("C9") == ["echo: hey"]
    assert "auth.test" in slack.method_names()

    form = slash_command_body("/gw", "x", response_url=slack.new_response_url("r1"))
    raw, form_headers = signed_form(SLACK_SECRET, form)
    response = await bolt.async_dispatch(bolt_request(raw, form_headers))
    assert response.status == 200 and response.body == "working"
    responses = await slack.wait_for_responses(1)
    assert responses[0]["text"] == "done: x"

    bad_body, bad_headers = signed_json("wrong-secret", event_callback())
    response = await bolt.async_dispatch(bolt_request(bad_body, bad_headers))
    assert response.status == 401


# --- Mattermost ---------------------------------------------------------------------


async def _authenticated_ws(
    http: aiohttp.ClientSession, mm: FakeMattermost, token: str = MM_TOKEN
) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(mm.ws_url)
    await ws.send_json({"seq": 1, "action": "authentication_challenge", "data": {"token": token}})
    assert await ws.receive_json(timeout=5) == {"status": "OK", "seq_reply": 1}
    hello = await ws.receive_json(timeout=5)
    assert hello["event"] == "hello" and hello["broadcast"]["user_id"] == mm.bot_user["id"]
    return ws


async def test_mattermost_websocket_posted_and_drop(
    mm: FakeMattermost, http: aiohttp.ClientSession
) -> None:
    ws = await _authenticated_ws(http, mm)
    await mm.wait_for_sockets(1)
    post = await mm.create_post("general", "hello bot")
    event = await ws.receive_json(timeout=5)
    assert event["event"] == "posted"
    assert isinstance(event["data"]["post"], str)
    assert json.loads(event["data"]["post"]) == post
    assert post["user_id"] == HUMAN_USER_ID and event["data"]["channel_name"] == "general"

    assert await mm.redeliver(post["id"]) == 1
    again = await ws.receive_json(timeout=5)
    assert json.loads(again["data"]["post"])["id"] == post["id"] and again["seq"] > event["seq"]

    await ws.send_json({"seq": 2, "action": "ping"})
    pong = await ws.receive_json(timeout=5)
    assert pong["seq_reply"] == 2 and pong["data"]["text"] == "pong"

    assert await mm.drop_sockets(1011) == 1
    msg = await ws.receive(timeout=5)
    assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1011
    await ws.close()
    await wait_until(lambda: mm.open_sockets == 0, message="socket removed")
    assert (mm.ws_connections, mm.ws_authenticated) == (1, 1)


async def test_mattermost_wrong_token_kill_and_refuse(
    mm: FakeMattermost, http: aiohttp.ClientSession
) -> None:
    ws = await http.ws_connect(mm.ws_url)
    await ws.send_json({"seq": 1, "action": "authentication_challenge", "data": {"token": "nope"}})
    reply = await ws.receive_json(timeout=5)
    assert reply["status"] == "FAIL" and reply["seq_reply"] == 1
    closed = await ws.receive(timeout=5)
    assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == 1008
    await ws.close()
    assert mm.ws_auth_failures == 1

    # header auth on the upgrade: hello at once; then an abrupt kill (no close frame)
    ws = await http.ws_connect(mm.ws_url, headers={"Authorization": f"Bearer {MM_TOKEN}"})
    assert (await ws.receive_json(timeout=5))["event"] == "hello"
    assert mm.kill_sockets() == 1
    msg = await ws.receive(timeout=5)
    assert msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
    assert ws.close_code != 1000

    mm.set_accepting(False)
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await http.ws_connect(mm.ws_url)
    assert info.value.status == 503
    mm.set_accepting(True)
    ws = await _authenticated_ws(http, mm)
    await ws.close()
    assert mm.ws_attempts == 4 and mm.ws_connections == 3


async def test_mattermost_rest(mm: FakeMattermost, http: aiohttp.ClientSession) -> None:
    api = mm.api_url
    async with http.get(f"{api}/users/me") as resp:
        assert resp.status == 401
    async with http.post(
        f"{api}/users/login", json={"login_id": mm.login_id, "password": "bad"}
    ) as resp:
        assert resp.status == 401
    async with http.post(
        f"{api}/users/login", json={"login_id": mm.login_id, "password": mm.password}
    ) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/json"
        session_token = resp.headers["Token"]
        assert (await resp.json())["id"] == mm.bot_user["id"]
    auth = {"Authorization": f"Bearer {session_token}"}

    async with http.get(f"{api}/users/me", headers=auth) as resp:
        assert resp.headers["Content-Type"] == "application/json"
        assert (await resp.json())["username"] == mm.bot_user["username"]
    async with http.get(f"{api}/users/me/teams", headers=auth) as resp:
        teams = await resp.json()
    async with http.get(f"{api}/users/me/teams/{teams[0]['id']}/channels", headers=auth) as resp:
        assert sorted(c["id"] for c in await resp.json()) == ["general", "random"]
    async with http.get(f"{api}/users/me/channels", headers=auth) as resp:
        assert len(await resp.json()) == 2

    ws = await _authenticated_ws(http, mm, token=session_token)
    before = mm.make_post("general", "old")["create_at"]
    user_post = await mm.create_post("general", "question")
    assert json.loads((await ws.receive_json(timeout=5))["data"]["post"])["message"] == "question"
    async with http.post(
        f"{api}/posts",
        json={"channel_id": "general", "message": "answer", "root_id": user_post["id"]},
        headers=auth,
    ) as resp:
        assert resp.status == 201
        reply = await resp.json()
    assert mm.replies("general") == [reply] and mm.reply_messages() == ["answer"]
    echoed = json.loads((await ws.receive_json(timeout=5))["data"]["post"])
    assert echoed["id"] == reply["id"] and echoed["user_id"] == mm.bot_user["id"]
    await ws.close()

    async with http.get(
        f"{api}/channels/general/posts", params={"since": before}, headers=auth
    ) as resp:
        page = await resp.json()
    assert page["order"] == [reply["id"], user_post["id"]]
    assert page["posts"][user_post["id"]]["message"] == "question"

    mm.fail_next("create_post", status=429, retry_after=4)
    async with http.post(
        f"{api}/posts", json={"channel_id": "general", "message": "x"}, headers=auth
    ) as resp:
        assert resp.status == 429 and resp.headers["Retry-After"] == "4"
        assert (await resp.json())["status_code"] == 429
    assert len(mm.replies()) == 1


async def test_mattermost_patch_and_typing(mm: FakeMattermost,
                                           http: aiohttp.ClientSession) -> None:
    api, auth = mm.api_url, {"Authorization": f"Bearer {MM_TOKEN}"}
    ws = await _authenticated_ws(http, mm, token=MM_TOKEN)
    async with http.post(f"{api}/users/me/typing", json={"channel_id": "general"},
                         headers=auth) as resp:
        assert resp.status == 200
    async with http.post(f"{api}/users/{HUMAN_USER_ID}/typing",
                         json={"channel_id": "general"}, headers=auth) as resp:
        assert resp.status == 403
    assert [p["channel_id"] for p in mm.typing_calls("general")] == ["general", "general"]
    async with http.post(f"{api}/posts", json={"channel_id": "general", "message": "Hel"},
                         headers=auth) as resp:
        post = await resp.json()
    await ws.receive_json(timeout=5)  # its posted echo
    async with http.put(f"{api}/posts/{post['id']}/patch", json={"message": "Hello"},
                        headers=auth) as resp:
        assert resp.status == 200
        patched = await resp.json()
    assert patched["message"] == "Hello" and patched["edit_at"] > 0
    event = await ws.receive_json(timeout=5)
    assert event["event"] == "post_edited"
    assert json.loads(event["data"]["post"])["message"] == "Hello"
    human = await mm.create_post("general", "mine")
    for post_id, status in ((human["id"], 403), ("nosuchpost", 404)):
        async with http.put(f"{api}/posts/{post_id}/patch", json={"message": "x"},
                            headers=auth) as resp:
            assert resp.status == status
    assert mm.shown("general")[0] == ["Hel", "Hello"]
    assert len(mm.patches()) == 3
    await ws.close()


async def test_mattermost_close_with_open_socket(http: aiohttp.ClientSession) -> None:
    fake = await FakeMattermost().start()
    ws = await _authenticated_ws(http, fake, token=fake.token)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await fake.close()
    assert loop.time() - started < 3.0
    msg = await ws.receive(timeout=5)
    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    await ws.close()
