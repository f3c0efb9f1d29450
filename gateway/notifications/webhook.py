"""Webhook destinations: ``POST`` of the feed row as JSON, signed as Standard Webhooks.

``webhook-id`` is ``<topic>:<offset>``, the same on every attempt (and after a replay), so a
receiver deduplicates on it; ``webhook-timestamp`` is the attempt's time. The body is the
row's wire JSON, encoded once per row whatever the number of subscriptions sending it; only
the signature is made per subscription. Neither the secret nor the body reaches a log.
"""

from __future__ import annotations

import time

import aiohttp
from yarl import URL

from gateway.notifications.outcome import Outcome, of_status
from gateway.notifications.subscriptions import secret_key
from gateway.outbound.safe_http import Refused, SafeClient
from gateway.outbound.standard_webhooks import sign_standard
from gateway.push.protocol import FeedRow

USER_AGENT = "gateway-notifications/1"


def message_id(row: FeedRow) -> str:
    return f"{row.topic}:{row.offset}"


class WebhookSender:
    """One per subscription (it keeps the decoded key)."""

    def __init__(self, client: SafeClient, url: str, secret: str) -> None:
        self.client = client
        self.url = url
        self.key = secret_key(secret)
        self.target: URL | Refused
        try:
            self.target = client.target(url)
        except Refused as exc:  # the settings changed since it was made: every attempt fails
            self.target = exc

    async def send(self, row: FeedRow) -> Outcome:
        if isinstance(self.target, Refused):
            return Outcome("failed", f"refused: {self.target}")
        body = row.wire.encode()
        headers = sign_standard(self.key, message_id(row), int(time.time()), body)
        headers["Content-Type"] = "application/json"
        headers["User-Agent"] = USER_AGENT
        try:
            answer = await self.client.post(self.target, body, headers)
        except Refused as exc:
            return Outcome("failed", f"refused: {exc}")
        except TimeoutError:
            return Outcome("failed", "timed out")
        except aiohttp.ClientError as exc:
            return Outcome("failed", f"{type(exc).__name__}: {str(exc)[:200]}")
        return of_status(answer.status, answer.headers.get("Retry-After"), answer.body)
