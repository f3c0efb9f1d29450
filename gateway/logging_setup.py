"""Logging for every command: one format, secrets masked, noisy libraries quietened.

httpx logs request URLs at INFO, and Telegram URLs carry the bot token (``/bot<token>/``), so
httpx is held at WARNING and every record passes a filter that masks configured secrets.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable

_TELEGRAM_TOKEN = re.compile(r"bot\d+:[A-Za-z0-9_-]{20,}")


class RedactSecrets(logging.Filter):
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s and len(s) >= 4]

    def _clean(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return _TELEGRAM_TOKEN.sub("bot***", text)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = self._clean(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def configure(secrets: Iterable[str] = (), level: str | None = None) -> None:
    level = level or os.environ.get("GATEWAY_LOG_LEVEL", "INFO")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactSecrets(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "aiohttp.access", "telegram.ext.Updater"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
