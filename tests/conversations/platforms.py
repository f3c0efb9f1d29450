"""One chat per platform, driven the same way: the real app (or listener) with its real bot
library against the platform's fake, a message sent in, and what the chat showed read back.
Used by the streamed-reply and llm-handler tests."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

from gateway.config import Secret, Settings
from gateway.inbound.telegram import TELEGRAM_BOT
from gateway.stores.runtime import Runtime, open_runtime
from tests.conversations.fast import Apps, with_sections
from tests.fakes import FakeMattermost, FakeSlack, FakeTelegram, event_callback, text_update
from tests.fakes.base import Call
from tests.fakes.pytest_plugin import SLACK_TOKEN, TELEGRAM_TOKEN
from tests.fakes.slack import CHANNEL_ID, signed_json
from tests.helpers import wait_until
from tests.inbound.mattermost.helpers import mattermost_settings, running

WEBHOOK_SECRET = "wh-secret_123"
SLACK_SECRET = "slack-signing-secret"
INBOX_FAST = {"poll_seconds": 0.05, "drain_seconds": 0.3, "lease_seconds": 5}


def rate(per_second: float) -> dict[str, Any]:
    return {"rate": per_second, "period": 1, "burst": 1}


def limits(chat_per_second: float) -> dict[str, Any]:
    """The chat's bucket at ``chat_per_second`` (one at a time), the rest generous."""
    return {"platforms": {
        "telegram": {"bot": rate(1000), "chat": rate(chat_per_second)},
        "slack": {"channel": rate(chat_per_second)},
        "mattermost": {"bot": rate(chat_per_second)}}}


class Chat(abc.ABC):
    """A platform chat: ``start`` the bot, ``say`` something, read what the chat showed."""

    name: str
    post_method: str
    edit_method: str

    def __init__(self, settings: Settings, fake: Any, make_client: Callable[..., Any]) -> None:
        self.settings, self.fake, self.make_client = settings, fake, make_client
        self.apps = Apps(make_client)
        self.client: Any = None
        self.stack = contextlib.AsyncExitStack()  # what else a start opened

    @abc.abstractmethod
    async def start(self, sections: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    async def say(self, text: str, thread: str | None = None) -> None:
        """A user's message, in ``thread`` (a Slack ``thread_ts``, a Mattermost root post id)
        where the platform has threads."""

    @abc.abstractmethod
    def shown(self) -> list[list[str]]: ...

    @abc.abstractmethod
    def typing(self) -> list[Call]: ...

    async def stop(self) -> None:
        await self.stack.aclose()
        await self.apps.close()

    async def start_app(self, settings: Settings, component: str) -> Any:
        """The app with ``component`` on ``settings`` and the test sections; its client."""
        self.client, app = await self.apps.start(settings, ("gateway.web.health", component))
        return app

    def replies(self) -> list[Call]:
        """The posts and edits of the bot's messages, oldest first (typing excluded)."""
        return [c for c in self.fake.calls if c.method in (self.post_method, self.edit_method)]

    async def wait_for_text(self, text: str, timeout: float = 15.0) -> list[list[str]]:
        """Until the chat's last bot message shows exactly ``text``; what the chat showed."""
        return await wait_until(lambda: self.shown() if self.shown() and self.shown()[-1][-1]
                                == text else None, timeout=timeout,
                                message=f"{self.name} shows {text!r}: {self.shown()}")


class TelegramChat(Chat):
    name, post_method, edit_method = "telegram", "sendMessage", "editMessageText"
    chat_id = 777
    fake: FakeTelegram

    async def start(self, sections: dict[str, Any]) -> None:
        app = await self.start_app(dataclasses.replace(
            with_sections(self.settings, **sections), telegram_bot_token=Secret(TELEGRAM_TOKEN),
            telegram_webhook_secret=Secret(WEBHOOK_SECRET), telegram_api_url=self.fake.api_url),
            "gateway.inbound.telegram")
        await wait_until(app[TELEGRAM_BOT].ready.is_set, message="telegram bot ready")

    async def say(self, text: str, thread: str | None = None) -> None:
        assert thread is None, "Telegram chats have no threads"
        async with self.client.post("/telegram/webhook",
                                    json=text_update(text, chat_id=self.chat_id),
                                    headers={"X-Telegram-Bot-Api-Secret-Token":
                                             WEBHOOK_SECRET}) as response:
            assert response.status == 200, await response.text()

    def shown(self) -> list[list[str]]:
        return self.fake.shown(self.chat_id)

    def typing(self) -> list[Call]:
        return self.fake.chat_actions(self.chat_id)


class SlackChat(Chat):
    name, post_method, edit_method = "slack", "chat.postMessage", "chat.update"
    fake: FakeSlack

    async def start(self, sections: dict[str, Any]) -> None:
        await self.start_app(dataclasses.replace(
            with_sections(self.settings, **sections), slack_bot_token=Secret(SLACK_TOKEN),
            slack_signing_secret=Secret(SLACK_SECRET), slack_api_url=self.fake.api_url),
            "gateway.inbound.slack")

    async def say(self, text: str, thread: str | None = None) -> None:
        body, headers = signed_json(SLACK_SECRET, event_callback(event_type="app_mention",
                                                                 text=text, thread_ts=thread))
        async with self.client.post("/slack/events", data=body, headers=headers) as response:
            assert response.status == 200, await response.text()

    def shown(self) -> list[list[str]]:
        return self.fake.shown(CHANNEL_ID)

    def typing(self) -> list[Call]:
        return []  # Slack's Web API has no typing indicator for bots


class MattermostChat(Chat):
    name, post_method, edit_method = "mattermost", "create_post", "patch_post"
    channel = "general"
    fake: FakeMattermost

    async def start(self, sections: dict[str, Any]) -> None:
        settings = mattermost_settings(with_sections(self.settings, **sections),
                                       self.fake.url)

        rt = await open_runtime(settings)
        self.stack.push_async_callback(rt.close)
        await self.stack.enter_async_context(running(rt, handler=None))
        await self.fake.wait_for_sockets()

    async def say(self, text: str, thread: str | None = None) -> None:
        await self.fake.create_post(self.channel, text, root_id=thread or "")

    def shown(self) -> list[list[str]]:
        return self.fake.shown(self.channel)

    def typing(self) -> list[Call]:
        return self.fake.calls_to("typing")


async def bot_replies(runtime: Runtime) -> list[str]:
    """The replies the conversation store holds, oldest first."""
    rows = await runtime.pg.fetch(
        "SELECT text FROM conversation_messages WHERE role = 'bot' ORDER BY created_at, seq")
    return [row["text"] for row in rows]


KINDS: dict[str, type[Chat]] = {"telegram": TelegramChat, "slack": SlackChat,
                                "mattermost": MattermostChat}


@contextlib.asynccontextmanager
async def chat_on(platform: str, settings: Settings, fake: Any,
                  make_client: Callable[..., Any]) -> AsyncIterator[Chat]:
    """A ``Chat`` on ``platform`` (its fake started by the caller), stopped afterwards."""
    chat = KINDS[platform](settings, fake, make_client)
    try:
        yield chat
    finally:
        await chat.stop()


def gaps(calls: list[Call]) -> list[float]:
    """Seconds between consecutive calls."""
    return [b.time - a.time for a, b in itertools.pairwise(calls)]


def assert_grew_in_one_message(chat: Chat, full: str, per_second: float) -> list[str]:
    """The chat shows one bot message, posted with the first words and edited as the text
    grew (each text a longer start of the whole, so never the same twice) to exactly
    ``full``, every platform call at least the chat limit's spacing after the one before;
    what it showed."""
    [texts] = chat.shown()
    assert texts[-1] == full
    assert len(texts) >= 3, texts  # the first words, at least one edit, the whole text
    assert all(full.startswith(text) for text in texts)
    assert all(len(a) < len(b) for a, b in itertools.pairwise(texts))
    calls = chat.replies()
    assert len(calls) == len(texts)  # no edit was refused (none to the same text)
    # Spaced by the limiter on Redis time; arrival here adds each call's own latency.
    assert min(gaps(calls)) >= 1 / per_second - 0.1, gaps(calls)
    return texts
