"""A webhook receiver on loopback, as another system would run one: every ``POST /<path>`` is
verified with the reference ``standardwebhooks`` code against the secret registered for its
path, recorded (``webhook-id``, body, arrival time), and answered as the test scripted it:
a status queue per path (``fail``), a delay, a ``Retry-After``, a redirect, an endless body.
A path with no secret registered is recorded unverified."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.fakes.base import FakeServer


@dataclass(frozen=True)
class Delivery:
    path: str
    id: str
    body: dict[str, Any]
    time: float
    verified: bool


@dataclass
class Answer:
    status: int = 200
    retry_after: str | None = None
    location: str | None = None
    delay: float = 0.0
    endless: bool = False  # stream a body that never ends (until the client hangs up)


class Receiver(FakeServer):
    def __init__(self) -> None:
        super().__init__()
        self.secrets: dict[str, str] = {}
        self.deliveries: list[Delivery] = []
        self.refused: list[str] = []  # paths whose signature did not verify
        self._answers: dict[str, deque[Answer]] = {}
        self.default = Answer()
        self.slow = 0.0  # every answer waits this long first
        self.failing_ids: dict[str, int] = {}  # webhook-id -> the status it always gets
        self.endless_written = 0
        self.endless_ended = False  # the endless answer stopped (the client hung up)

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post("/{path:.*}", self._receive)
        return app

    def endpoint(self, path: str, secret: str | None = None) -> str:
        if secret is not None:
            self.secrets[path] = secret
        return f"{self.url}/{path}"

    def answer(self, path: str, *answers: Answer) -> None:
        """Answer the next requests to ``path`` so, in order (then as ``default``)."""
        self._answers.setdefault(path, deque()).extend(answers)

    def fail(self, path: str, status: int, times: int = 1) -> None:
        self.answer(path, *[Answer(status)] * times)

    def to(self, path: str) -> list[Delivery]:
        return [d for d in self.deliveries if d.path == path]

    def ids(self, path: str) -> list[str]:
        return [d.id for d in self.to(path)]

    async def _receive(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        secret = self.secrets.get(path)
        verified = False
        if secret is not None:
            try:
                Webhook(secret).verify(body, headers)
                verified = True
            except WebhookVerificationError:
                self.refused.append(path)
                return web.Response(status=400)
        queued = self._answers.get(path)
        answer = queued.popleft() if queued else self.default
        if headers.get("webhook-id") in self.failing_ids:
            answer = Answer(self.failing_ids[headers["webhook-id"]])
        if self.slow or answer.delay:
            await asyncio.sleep(self.slow + answer.delay)
        self.deliveries.append(Delivery(path, headers.get("webhook-id", ""),
                                        json.loads(body) if body else {}, time.time(),
                                        verified))
        if answer.endless:
            return await self._endless(request)
        extra = {}
        if answer.retry_after is not None:
            extra["Retry-After"] = answer.retry_after
        if answer.location is not None:
            extra["Location"] = answer.location
        return web.Response(status=answer.status, headers=extra, text="ok")

    async def _endless(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        await response.prepare(request)
        chunk = b"x" * 65536
        try:
            while self.endless_written < 512 * 1024 * 1024:
                await response.write(chunk)
                self.endless_written += len(chunk)
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self.endless_ended = True
        return response
