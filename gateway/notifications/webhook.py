"""Webhook destinations: ``POST`` of the feed row as JSON, signed as Standard Webhooks.

``webhook-id`` is ``<topic>:<offset>``, the same on every attempt (and after a replay), so a
receiver deduplicates on it; ``webhook-timestamp`` is the attempt's time (to the second: a
request made ready ahead, while the previous row's cursor was being written, is signed again
when it is more than ``READY_SECONDS`` old). The body is the row's wire JSON, encoded once per
row whatever the number of subscriptions sending it; only the signature is made per
subscription. Neither the secret nor the body reaches a log.
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
STATIC_HEADERS = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
READY_SECONDS = 1  # a signature made ahead is used up to this long after (its timestamp)

# (topic, offset, epoch), the signature's timestamp, the body, the headers
Ready = tuple[tuple[str, int, int], int, bytes, dict[str, str]]


def message_id(row: FeedRow) -> str:
    return f"{row.topic}:{row.offset}"


class WebhookSender:
    """One per subscription (it keeps the decoded key)."""

    def __init__(self, client: SafeClient, url: str, secret: str) -> None:
        self.client = client
        self.url = url
        self.key = secret_key(secret)
        self._ready: Ready | None = None
        self.target: URL | Refused
        try:
            self.target = client.target(url)
        except Refused as exc:  # the settings changed since it was made: every attempt fails
            self.target = exc

    def prepare(self, row: FeedRow) -> None:
        """Encode and sign ``row`` now (while the previous row's cursor is being written);
        ``send`` uses it if it is for that row and at most ``READY_SECONDS`` old."""
        self._ready = self._request(row)

    def _request(self, row: FeedRow) -> Ready:
        now = int(time.time())
        body = row.wire.encode()
        headers = sign_standard(self.key, message_id(row), now, body)
        headers.update(STATIC_HEADERS)
        return (row.topic, row.offset, row.epoch), now, body, headers

    def _take(self, row: FeedRow) -> Ready:
        ready, self._ready = self._ready, None
        if (ready is None or ready[0] != (row.topic, row.offset, row.epoch)
                or int(time.time()) - ready[1] > READY_SECONDS):
            return self._request(row)
        return ready

    async def send(self, row: FeedRow) -> Outcome:
        if isinstance(self.target, Refused):
            return Outcome("failed", f"refused: {self.target}")
        _, _, body, headers = self._take(row)
        try:
            answer = await self.client.post(self.target, body, headers)
        except Refused as exc:
            return Outcome("failed", f"refused: {exc}")
        except TimeoutError:
            return Outcome("failed", "timed out")
        except aiohttp.ClientError as exc:
            return Outcome("failed", f"{type(exc).__name__}: {str(exc)[:200]}")
        return of_status(answer.status, answer.headers.get("Retry-After"), answer.body)
