"""The public interface as an outside program uses it: environment variables, `gateway
telegram set-webhook URL` and `gateway serve --telegram-polling` as subprocesses against the
fake Bot API."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from gateway.stores.runtime import Runtime
from tests.conftest import ServerSet
from tests.fakes import FakeTelegram, text_update
from tests.fakes.pytest_plugin import TELEGRAM_TOKEN

SECRET = "cli-secret_1"


def environment(servers: ServerSet, fake: FakeTelegram) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GATEWAY_", "TELEGRAM_", "SLACK_", "MATTERMOST_"))}
    env.update(GATEWAY_DURABLE_URL=servers.durable_url, GATEWAY_CACHE_URL=servers.cache_url,
               GATEWAY_DATABASE_URL=servers.database_url, GATEWAY_PORT="0",
               TELEGRAM_BOT_TOKEN=TELEGRAM_TOKEN, TELEGRAM_WEBHOOK_SECRET=SECRET,
               TELEGRAM_API_URL=fake.api_url, GATEWAY_LOG_LEVEL="DEBUG")
    return env


async def test_set_webhook_command(servers: ServerSet, fake_telegram: FakeTelegram) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "telegram", "set-webhook",
        "https://gw.example/telegram/webhook", env=environment(servers, fake_telegram),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "webhook set: https://gw.example/telegram/webhook"
    assert fake_telegram.webhook_url == "https://gw.example/telegram/webhook"
    assert fake_telegram.webhook.get("secret_token") == SECRET
    assert TELEGRAM_TOKEN.split(":")[1] not in (out + err).decode()


async def test_serve_with_telegram_polling(servers: ServerSet, runtime: Runtime,
                                           fake_telegram: FakeTelegram) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--telegram-polling",
        env=environment(servers, fake_telegram),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        fake_telegram.push_update(text_update("via polling", chat_id=515))
        await fake_telegram.wait_for_messages(1, chat_id=515, timeout=60)
        assert fake_telegram.sent_texts(515) == ["echo: via polling (1 messages)"]
        assert "deleteWebhook" in fake_telegram.method_names()
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    log = err.decode()
    assert "long polling" in log
    assert TELEGRAM_TOKEN.split(":")[1] not in log
