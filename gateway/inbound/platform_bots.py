"""The Telegram and Slack components as ``create_app`` loads them: each imports its bot
module (python-telegram-bot with httpx, slack_bolt with slack_sdk: some 0.35 s of CPU
together) only when its platform is configured, so a ``gateway serve`` without them starts
without them. The bot modules' own ``setup`` is what runs."""

from __future__ import annotations

import importlib

from aiohttp import web

from gateway.config import Settings
from gateway.stores.runtime import Runtime


def _setup_if(configured: bool, module: str, app: web.Application, runtime: Runtime) -> None:
    if configured:
        importlib.import_module(module).setup(app, runtime)


def telegram(settings: Settings) -> bool:
    """The same condition ``gateway.inbound.telegram.setup`` starts the bot on."""
    return bool(settings.telegram_bot_token)


def slack(settings: Settings) -> bool:
    """The same condition ``gateway.inbound.slack.setup`` mounts its routes on."""
    return bool(settings.slack_bot_token and settings.slack_signing_secret)


def setup(app: web.Application, runtime: Runtime) -> None:
    _setup_if(telegram(runtime.settings), "gateway.inbound.telegram", app, runtime)
    _setup_if(slack(runtime.settings), "gateway.inbound.slack", app, runtime)
