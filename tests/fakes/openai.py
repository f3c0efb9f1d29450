"""Fake OpenAI-compatible model provider (``/v1/embeddings``, ``/v1/chat/completions``).

A real aiohttp server on 127.0.0.1, so the gateway's provider client talks to it over
loopback exactly as it would to OpenRouter, Groq, vLLM or Ollama. Usage::

    async with FakeOpenAI(api_key="sk-test", dimension=8) as fake:
        # [providers.fake] api = "openai", base_url = fake.base_url, api_key_env = "FAKE_KEY"
        ...
        call = fake.calls_to("embeddings")[0]
        assert call.params["model"] == "m" and call.token == "sk-test"

What it answers:

- ``POST /v1/embeddings`` ``{"model", "input": str | [str]}``: one deterministic unit vector
  per input (``fake_vector(text, dimension)``: the same text always gives the same vector),
  ``usage.prompt_tokens`` = ``fake_tokens`` summed over the inputs.
- ``POST /v1/chat/completions`` ``{"model", "messages", "stream"?, "stream_options"?}``: the
  reply is ``fake.reply`` (a string, or a function of the messages; default ``"echo: " +``
  the last message's content). Streamed, it is one SSE ``data:`` chunk per piece of
  ``split_reply(reply)`` (words with their trailing space), then a usage chunk if
  ``stream_options.include_usage`` is set, then ``data: [DONE]``. Usage: prompt tokens =
  ``fake_tokens`` over the messages' contents, completion tokens = ``fake_tokens(reply)``.
- A missing or wrong ``Authorization: Bearer`` key: 401 with an OpenAI-style error body.

Programmable failures, one queue per path consumed in order by the next matching calls
(``path`` is ``"embeddings"``, ``"chat"`` or ``"*"``, which any call takes when its own
queue is empty):

- ``fake.fail("chat", 429, retry_after=1)``: 429 with ``Retry-After`` (whole seconds),
  ``fake.fail("*", 500, times=3)``: three 500s.
- ``fake.slow("embeddings", 2.0)``: the next call waits 2 s before answering (timeouts).
- ``fake.hold("embeddings")``: every call to the path is recorded, then left unanswered
  (a provider stalling) until ``fake.release("embeddings")`` or the fake closes;
  ``fake.held`` counts the calls waiting so.
- ``fake.break_stream(after=2)``: the next streamed reply sends 2 deltas, then drops the
  connection (a provider failing mid-stream).
- ``fake.delay = 0.01``: every call takes at least this long (concurrency tests);
  ``fake.chunk_delay``: pause between streamed chunks.

What it records: ``fake.calls`` (``Call``: ``method`` ``"embeddings"`` or ``"chat"``,
``params`` the JSON body, ``time`` of arrival, ``token`` the bearer key, ``headers``), the
``usage`` it reported per call (``fake.usage``, same order as the calls that succeeded),
``in_flight`` and ``max_in_flight`` (the most requests it was serving at once).
``dead_port()`` gives a port where nothing listens (refused connections).

Wiring the gateway to it (``provider_tables`` builds the ``[providers.*]`` tables)::

    monkeypatch.setenv("FAKE_OPENAI_KEY", fake.api_key)
    settings = replace(settings, sections={"providers": provider_tables(("a", fake))})
    providers = ModelProviders.from_settings(settings, runtime.durable, runtime.pg)
    chain = providers.chain(["a"])      # ... await providers.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.base import FakeServer, Fault, json_response

__all__ = ["FakeOpenAI", "ReportedUsage", "dead_port", "fake_tokens", "fake_vector",
           "provider_tables", "split_reply"]

Reply = str | Callable[[Sequence[Mapping[str, Any]]], str]


def fake_tokens(text: str) -> int:
    """The fake's token count: whitespace-separated words, at least 1 per text."""
    return max(1, len(text.split()))


def fake_vector(text: str, dimension: int) -> list[float]:
    """A deterministic unit vector for ``text`` (SHA-256 stream as floats in [-1, 1])."""
    values: list[float] = []
    counter = 0
    while len(values) < dimension:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        values.extend(v / 2**31 for v in struct.unpack(">8i", digest))
        counter += 1
    values = values[:dimension]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def split_reply(reply: str) -> list[str]:
    """The deltas a streamed reply is sent in: each word with the spaces after it."""
    pieces: list[str] = []
    for word in reply.split(" "):
        if pieces and not word:
            pieces[-1] += " "
        else:
            pieces.append(word + " ")
    if pieces:
        pieces[-1] = pieces[-1][:-1]
    return [piece for piece in pieces if piece]


def dead_port() -> int:
    """A loopback port nothing listens on (bound then closed: connecting is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class ReportedUsage:
    """The usage the fake reported for one call."""

    method: str
    model: str
    prompt_tokens: int
    completion_tokens: int


class FakeOpenAI(FakeServer):
    """OpenAI-compatible provider on loopback; see the module docstring."""

    def __init__(self, api_key: str | None = "sk-test", *, dimension: int = 8,
                 reply: Reply | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host=host, port=port)
        self.api_key = api_key
        self.dimension = dimension
        self.reply: Reply = reply if reply is not None else _echo
        self.delay = 0.0
        self.chunk_delay = 0.0
        self.usage: list[ReportedUsage] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.held = 0
        self._break_after: list[int] = []
        self._holds: dict[str, asyncio.Event] = {}

    @property
    def base_url(self) -> str:
        """What ``[providers.<name>] base_url`` is set to."""
        return f"{self.url}/v1"

    # programming ----------------------------------------------------------
    def fail(self, path: str, status: int, *, retry_after: int | None = None,
             times: int = 1, message: str = "fake failure") -> None:
        """Answer the next ``times`` calls to ``path`` with ``status`` (and ``Retry-After``)."""
        self._queue_fault(path, Fault(status, retry_after=retry_after, description=message,
                                      remaining=times))

    def slow(self, path: str, seconds: float, *, times: int = 1) -> None:
        """The next ``times`` calls to ``path`` wait ``seconds`` before answering."""
        self._queue_fault(path, Fault(0, delay=seconds, remaining=times))

    def hold(self, path: str) -> None:
        """Leave calls to ``path`` (or ``"*"``: every path) unanswered, once recorded, until
        ``release(path)``."""
        self._holds.setdefault(path, asyncio.Event())

    def release(self, path: str) -> None:
        """Answer the calls ``hold(path)`` kept waiting, and the next ones at once."""
        gate = self._holds.pop(path, None)
        if gate is not None:
            gate.set()

    def break_stream(self, after: int) -> None:
        """The next streamed reply sends ``after`` deltas, then drops the connection."""
        self._break_after.append(after)

    def reset(self) -> None:
        """Forget calls, usage, faults and the in-flight peak; release held calls."""
        for path in list(self._holds):
            self.release(path)
        self.reset_calls()
        self.clear_faults()
        self.usage.clear()
        self._break_after.clear()
        self.max_in_flight = self.in_flight

    def reply_for(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The reply text the fake gives to ``messages``."""
        return self.reply(messages) if callable(self.reply) else self.reply

    # serving --------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _enter(self, path: str, request: web.Request) -> tuple[dict[str, Any],
                                                                    web.Response | None]:
        """Record the call, apply auth, faults and delays; a response means answer it."""
        try:
            body = await request.json()
        except ValueError:
            body = None
        params = body if isinstance(body, dict) else {"_body": body}
        header = request.headers.get("Authorization", "")
        token = header[len("Bearer "):] if header.startswith("Bearer ") else None
        self.record(path, params, request, token=token)
        gate = self._holds.get(path) or self._holds.get("*")
        if gate is not None:
            await self._held(gate)
        fault = self.take_fault(path)
        await self._pause(max(self.delay, fault.delay if fault is not None else 0.0))
        if self.api_key is not None and token != self.api_key:
            return params, _error(401, "invalid_api_key", "Incorrect API key provided")
        if fault is not None and fault.status:
            headers = {} if fault.retry_after is None else {"Retry-After": str(fault.retry_after)}
            return params, _error(fault.status, "fake_fault", fault.description or "", headers)
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return params, _error(400, "invalid_request_error", "model is required")
        return params, None

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the fake is closing (so closing never waits on it)."""
        if seconds <= 0 or self._closing is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._closing.wait()

    async def _held(self, gate: asyncio.Event) -> None:
        """Wait until ``gate`` is set or the fake is closing."""
        assert self._closing is not None
        self.held += 1
        try:
            closing = asyncio.ensure_future(self._closing.wait())
            released = asyncio.ensure_future(gate.wait())
            try:
                await asyncio.wait((closing, released), return_when=asyncio.FIRST_COMPLETED)
            finally:
                closing.cancel()
                released.cancel()
        finally:
            self.held -= 1

    def _begin(self) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        self._begin()
        try:
            params, refused = await self._enter("embeddings", request)
            if refused is not None:
                return refused
            raw = params.get("input")
            inputs = [raw] if isinstance(raw, str) else raw
            if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
                return _error(400, "invalid_request_error", "input must be a string or strings")
            tokens = sum(fake_tokens(text) for text in inputs)
            self.usage.append(ReportedUsage("embeddings", params["model"], tokens, 0))
            return json_response({
                "object": "list", "model": params["model"],
                "data": [{"object": "embedding", "index": i,
                          "embedding": fake_vector(text, self.dimension)}
                         for i, text in enumerate(inputs)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            })
        finally:
            self.in_flight -= 1

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self._begin()
        try:
            params, refused = await self._enter("chat", request)
            if refused is not None:
                return refused
            messages = params.get("messages")
            if not isinstance(messages, list) or not messages:
                return _error(400, "invalid_request_error", "messages must be a list")
            reply = self.reply_for(messages)
            prompt = sum(fake_tokens(str(m.get("content", ""))) for m in messages
                         if isinstance(m, dict))
            usage = {"prompt_tokens": prompt, "completion_tokens": fake_tokens(reply),
                     "total_tokens": prompt + fake_tokens(reply)}
            if params.get("stream"):
                return await self._stream(request, params, reply, usage)
            self.usage.append(ReportedUsage("chat", params["model"], prompt,
                                            usage["completion_tokens"]))
            return json_response({
                "id": f"chatcmpl-{len(self.calls)}", "object": "chat.completion",
                "created": int(time.time()), "model": params["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply}}],
                "usage": usage,
            })
        finally:
            self.in_flight -= 1

    async def _stream(self, request: web.Request, params: dict[str, Any], reply: str,
                      usage: dict[str, int]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        model = params["model"]
        base = {"id": f"chatcmpl-{len(self.calls)}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": model}
        break_after = self._break_after.pop(0) if self._break_after else None
        first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                             "content": ""}}]}
        await _send(response, first)
        for number, piece in enumerate(split_reply(reply)):
            if break_after is not None and number >= break_after:
                assert request.transport is not None
                request.transport.close()  # mid-stream failure: no [DONE]
                return response
            await self._pause(self.chunk_delay)
            await _send(response, {**base, "choices": [{"index": 0,
                                                        "delta": {"content": piece}}]})
        await _send(response, {**base, "choices": [{"index": 0, "delta": {},
                                                    "finish_reason": "stop"}]})
        options = params.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            await _send(response, {**base, "choices": [], "usage": usage})
        self.usage.append(ReportedUsage("chat", model, usage["prompt_tokens"],
                                        usage["completion_tokens"]))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _echo(messages: Sequence[Mapping[str, Any]]) -> str:
    return "echo: " + str(messages[-1].get("content", ""))


async def _send(response: web.StreamResponse, chunk: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")


def _error(status: int, code: str, message: str,
           headers: Mapping[str, str] | None = None) -> web.Response:
    return json_response({"error": {"message": message, "type": code, "code": code}},
                         status=status, headers=headers)


def provider_tables(*fakes: tuple[str, FakeOpenAI | str], key_env: str = "FAKE_OPENAI_KEY",
                    **limits: Any) -> dict[str, dict[str, Any]]:
    """``[providers.<name>]`` tables for ``Settings.sections["providers"]``: each entry is
    ``(name, fake)`` or ``(name, base_url)`` (e.g. a ``dead_port()`` URL); ``limits`` are
    added to every table (``requests_per_minute=..., window_seconds=...``). Set the
    environment variable ``key_env`` to the fakes' key (``monkeypatch.setenv``)."""
    tables: dict[str, dict[str, Any]] = {}
    for name, target in fakes:
        url = target.base_url if isinstance(target, FakeOpenAI) else target
        tables[name] = {"api": "openai", "base_url": url, "api_key_env": key_env, **limits}
    return tables
