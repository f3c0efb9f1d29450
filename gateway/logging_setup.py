"""Logging for every command: one format, secrets masked, repeats bounded, noisy libraries
quietened.

httpx logs request URLs at INFO, and Telegram URLs carry the bot token (``/bot<token>/``), so
httpx is held at WARNING, and the formatter masks configured secrets in the whole output, the
traceback included (an exception's text can carry a URL or a credential). A client that
triggers the same error again and again cannot flood the log: each distinct message (logger,
level, template, exception type) is written at most ``REPEATS`` times a ``WINDOW``, then one
line says how many were left out.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable

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


class RedactingFormatter(logging.Formatter):
    """The whole formatted record masked, traceback and stack included."""

    def __init__(self, fmt: str, secrets: Iterable[str] = ()) -> None:
        super().__init__(fmt)
        self.redact = RedactSecrets(secrets)

    def format(self, record: logging.LogRecord) -> str:
        return self.redact._clean(super().format(record))


REPEATS = 5
WINDOW = 60.0
MAX_KEYS = 1000
SWEEP_SECONDS = 1.0


class RepeatLimiter(logging.Filter):
    """At most ``REPEATS`` records per distinct message per ``WINDOW`` seconds. What was left
    out is said once its window is over: by the next record of the same message, or, when that
    message stopped, by a line of its own written with the next record of any other (checked
    at most once a second), so a flood that stops still leaves its count in the log."""

    def __init__(self, repeats: int = REPEATS, window: float = WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.repeats = repeats
        self.window = window
        self.clock = clock
        self._seen: dict[tuple[str, int, str, str], tuple[float, int, int]] = {}
        self._next_sweep = 0.0
        self._sweeping = False

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        key = (record.name, record.levelno, str(record.msg)[:200], exc)
        now = self.clock()
        start, written, dropped = self._seen.get(key, (now, 0, 0))
        if now - start >= self.window:
            if dropped:  # no % in the note: the message stays a valid template
                record.msg = (f"{record.msg} [and {dropped} more like it in the last"
                              f" {self.window:.0f} s, not written]")
            start, written, dropped = now, 0, 0
        if written >= self.repeats:
            self._remember(key, (start, written, dropped + 1))
            allowed = False
        else:
            self._remember(key, (start, written + 1, dropped))
            allowed = True
        if now >= self._next_sweep and not self._sweeping:
            self._sweep(now)
        return allowed

    def _sweep(self, now: float) -> None:
        """A line for each message whose window is over with records left out, and that
        has not come back to say so itself."""
        self._next_sweep = now + SWEEP_SECONDS
        ended = [(key, dropped) for key, (start, _, dropped) in self._seen.items()
                 if dropped and now - start >= self.window]
        self._sweeping = True  # the lines below pass this filter too
        try:
            for key, dropped in ended:
                del self._seen[key]
                name, level, message, _ = key
                logging.getLogger(name).log(
                    level, "%d more like %r in the last %.0f s were not written", dropped,
                    message, self.window)
        finally:
            self._sweeping = False

    def _remember(self, key: tuple[str, int, str, str], value: tuple[float, int, int]) -> None:
        if len(self._seen) >= MAX_KEYS and key not in self._seen:
            self._seen.clear()  # bounded: a flood of distinct messages restarts the count
        self._seen[key] = value


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def is_level(name: str) -> bool:
    """A level ``GATEWAY_LOG_LEVEL`` may name (any case)."""
    return name.strip().upper() in LEVELS


def configure(secrets: Iterable[str] = (), level: str | None = None) -> None:
    level = level or os.environ.get("GATEWAY_LOG_LEVEL", "INFO")
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                            secrets))
    handler.addFilter(RedactSecrets(secrets))
    handler.addFilter(RepeatLimiter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.strip().upper())
    for noisy in ("httpx", "httpcore", "aiohttp.access", "telegram.ext.Updater"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
