"""The chat platforms' routes, configured against the fakes, fed malformed input: a JSON 4xx
and no error log, as for every other route (``test_malformed.py``, where they are not
configured). Signed or carrying the right secret where the point is what comes after."""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from gateway.config import Secret
from gateway.inbound.telegram import TELEGRAM_BOT
from gateway.stores.runtime import Runtime
from gateway.web.app import create_app
from tests.fakes import FakeSlack, FakeTelegram
from tests.fakes.pytest_plugin import SLACK_TOKEN, TELEGRAM_TOKEN
from tests.helpers import wait_until

TG_SECRET = "tg-secret_1"
SLACK_SECRET = "slack-signing-secret"
JSON = {"Content-Type": "application/json"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def telegram(body: bytes, secret: str | None = TG_SECRET) -> dict[str, Any]:
    headers = {**JSON, **({"X-Telegram-Bot-Api-Secret-Token": secret} if secret else {})}
    return {"data": body, "headers": headers}


def slack(body: bytes, content: dict[str, str] = JSON, timestamp: int | str | None = None
          ) -> dict[str, Any]:
    """Signed as Slack signs (``v0:<ts>:<body>``), over the raw bytes: the SDK's own signer
    decodes the body first, so it cannot sign one that is not UTF-8."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(SLACK_SECRET.encode(), b"v0:" + ts.encode() + b":" + body, "sha256")
    return {"data": body, "headers": {**content, "X-Slack-Request-Timestamp": ts,
                                      "X-Slack-Signature": "v0=" + digest.hexdigest()}}


CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("telegram-no-secret", "/telegram/webhook", telegram(b"{}", secret=None)),
    ("telegram-wrong-secret", "/telegram/webhook", telegram(b"{}", secret="nope")),
    ("telegram-bad-json", "/telegram/webhook", telegram(b"{nope")),
    ("telegram-bad-utf8", "/telegram/webhook", telegram(b'{"update_id": "\xff"}')),
    ("telegram-array", "/telegram/webhook", telegram(b"[1, 2]")),
    ("telegram-update-id-text", "/telegram/webhook", telegram(b'{"update_id": "x"}')),
    ("telegram-update-id-huge", "/telegram/webhook",
     telegram(b'{"update_id": 1' + b"0" * 400 + b"}")),
    ("telegram-message-wrong-type", "/telegram/webhook",
     telegram(b'{"update_id": 5, "message": "hello"}')),
    ("telegram-nul", "/telegram/webhook",
     telegram(b'{"update_id": 6, "message": {"message_id": 1, "date": 1, "text": "a\\u0000",'
              b' "chat": {"id": 1, "type": "private"}, "from": {"id": 2, "is_bot": false,'
              b' "first_name": "x"}}}')),
    ("telegram-text-plain", "/telegram/webhook",
     {"data": b"{}", "headers": {"Content-Type": "text/plain",
                                 "X-Telegram-Bot-Api-Secret-Token": TG_SECRET}}),
    ("slack-unsigned", "/slack/events", {"data": b"{}", "headers": JSON}),
    ("slack-stale", "/slack/events", slack(b"{}", timestamp=1)),
    ("slack-timestamp-garbage", "/slack/events", slack(b"{}", timestamp="soon")),
    ("slack-bad-json", "/slack/events", slack(b"{nope")),
    ("slack-bad-utf8", "/slack/events", slack(b'{"type": "\xff"}')),
    ("slack-array", "/slack/events", slack(b"[1]")),
    ("slack-event-wrong-type", "/slack/events",
     slack(b'{"type": "event_callback", "event_id": 5, "event": "x"}')),
    ("slack-challenge-object", "/slack/events",
     slack(b'{"type": "url_verification", "challenge": {"a": 1}}')),
    ("slack-event-type-number", "/slack/events",
     slack(b'{"type": "event_callback", "event_id": "E1", "event": {"type": 5}}')),
    ("slack-type-number", "/slack/events", slack(b'{"type": 5}')),
    ("slack-authorizations-text", "/slack/events",
     slack(b'{"type": "event_callback", "event_id": "E2", "authorizations": "x",'
           b' "team_id": ["T"], "event": {"type": "app_mention", "user": 1, "text": 2}}')),
    ("slack-command-bad-utf8", "/slack/commands", slack(b"command=%ff&text=\xff", FORM)),
    ("slack-command-missing-fields", "/slack/commands", slack(b"a=b", FORM)),
    ("slack-command-as-json", "/slack/commands", slack(b'{"command": "/gw"}')),
]


@pytest.fixture
async def chat_client(make_client: Callable[..., Any], runtime: Runtime,
                      fake_telegram: FakeTelegram, fake_slack: FakeSlack) -> Any:
    settings = dataclasses.replace(
        runtime.settings, telegram_bot_token=Secret(TELEGRAM_TOKEN),
        telegram_webhook_secret=Secret(TG_SECRET), telegram_api_url=fake_telegram.api_url,
        slack_bot_token=Secret(SLACK_TOKEN), slack_signing_secret=Secret(SLACK_SECRET),
        slack_api_url=fake_slack.api_url)
    app = create_app(dataclasses.replace(runtime, settings=settings))
    client = await make_client(app)
    await wait_until(app[TELEGRAM_BOT].ready.is_set, message="bot ready")
    return client


@pytest.mark.parametrize(("path", "kwargs"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_malformed_chat_input_is_a_json_4xx_or_an_ignored_2xx(
        chat_client: Any, caplog: pytest.LogCaptureFixture, path: str,
        kwargs: dict[str, Any]) -> None:
    """A platform must not be made to retry what it sent: an update or event the gateway
    cannot use may be acknowledged (2xx, nothing taken in) instead of refused; anything
    else is a JSON 4xx. Never a 5xx, never an error log."""
    caplog.set_level(logging.INFO)
    response = await chat_client.post(path, **kwargs)
    text = await response.text()
    assert response.status < 500, (response.status, text[:300])
    if response.status >= 400:
        assert response.content_type == "application/json", text[:300]
        answer = json.loads(text)
        assert isinstance(answer.get("error"), str) and isinstance(answer.get("detail"), str)
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert noisy == [], [r.getMessage() for r in noisy]
