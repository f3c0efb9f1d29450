"""Local fake platform servers (Telegram Bot API, Slack Web API, Mattermost, an
OpenAI-compatible model provider) for tests.

Each fake is a real aiohttp server on 127.0.0.1 with a free port; point the
gateway's ``TELEGRAM_API_URL`` / ``SLACK_API_URL`` / ``MATTERMOST_URL`` at
``fake.api_url`` / ``fake.api_url`` / ``fake.url``.
"""

from tests.fakes.base import Call, FakeServer
from tests.fakes.mattermost import FakeMattermost
from tests.fakes.openai import FakeOpenAI
from tests.fakes.slack import FakeSlack, event_callback, sign_slack, slash_command_body
from tests.fakes.telegram import FakeTelegram, text_update
from tests.fakes.waiting import wait_until

__all__ = [
    "Call",
    "FakeMattermost",
    "FakeOpenAI",
    "FakeServer",
    "FakeSlack",
    "FakeTelegram",
    "event_callback",
    "sign_slack",
    "slash_command_body",
    "text_update",
    "wait_until",
]
