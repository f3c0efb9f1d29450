"""One OpenAI-compatible provider over HTTP: ``/embeddings``, ``/chat/completions`` plain and
streamed.

aiohttp with this small typed layer rather than the ``openai`` package: aiohttp is already
the service's HTTP stack, the layer is the three calls the gateway makes, and it keeps in our
hands what the chain depends on: ``Retry-After`` read as sent (the SDK retries 429s itself,
with its own back-off, invisible to our ``rl:`` limiter), every failure mapped to one of three
types (retry here, next provider, give up), and the SSE stream read line by line with a
timeout between chunks. It also keeps a second HTTP stack (httpx) out of the process.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.http_exceptions import LineTooLong

from gateway.providers.config import ProviderConfig
from gateway.providers.errors import ProviderError, RateLimited, Rejected, Unavailable

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": ...}

# The provider refused the request itself: another provider would refuse it too.
_REJECTED = frozenset({400, 413, 422})
# What of a refusal's body is read (its message; the rest is not needed).
REFUSAL_BYTES = 64 * 1024


@dataclass(frozen=True)
class Usage:
    """Tokens of one call; ``estimated`` when the provider reported none."""

    prompt_tokens: int
    completion_tokens: int = 0
    estimated: bool = False

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Embeddings:
    vectors: list[list[float]]
    usage: Usage
    provider: str = ""


@dataclass(frozen=True)
class Completion:
    text: str
    usage: Usage
    provider: str = ""


def estimate_tokens(text: str) -> int:
    """A cautious token count before the call: about 4 characters per token, rounded up
    (tokenizers give fewer for English prose, so the limiter rarely under-counts)."""
    return max(1, math.ceil(len(text) / 4))


def estimate_messages(messages: Sequence[Message]) -> int:
    return sum(estimate_tokens(m.get("content", "")) + 4 for m in messages)


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds; an HTTP date or garbage gives None)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


class ChatStream:
    """The text deltas of a streamed reply, in order; ``usage`` is set once it has ended
    (the provider's, or an estimate if it sent none). ``provider`` names who answered."""

    def __init__(self, provider: str = "") -> None:
        self._deltas: AsyncIterator[str] | None = None
        self.provider = provider
        self.usage: Usage | None = None

    def attach(self, deltas: AsyncIterator[str]) -> ChatStream:
        """Set the generator; it may fill ``usage`` and ``provider`` as it runs."""
        self._deltas = deltas
        return self

    def __aiter__(self) -> AsyncIterator[str]:
        if self._deltas is None:
            raise RuntimeError("ChatStream has no deltas attached")
        return self._deltas

    async def aclose(self) -> None:
        close = getattr(self._deltas, "aclose", None)
        if close is not None:
            await close()


class OpenAIClient:
    """Calls one provider; every failure is a ``RateLimited``, ``Unavailable`` or
    ``Rejected`` naming the provider, never its key."""

    def __init__(self, config: ProviderConfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self.name = config.name
        self.session = session

    def __repr__(self) -> str:
        return f"OpenAIClient({self.name!r}, {self.config.base_url!r})"

    # calls ----------------------------------------------------------------
    async def embeddings(self, model: str, inputs: Sequence[str]) -> Embeddings:
        """One vector per input, in input order."""
        body = await self._post("/embeddings", {"model": model, "input": list(inputs)})
        try:
            rows = sorted(body["data"], key=lambda row: row["index"])
            vectors = [[float(v) for v in row["embedding"]] for row in rows]
        except (KeyError, TypeError, ValueError) as exc:
            raise Unavailable(self.name, f"malformed embeddings answer ({exc!r})") from None
        if len(vectors) != len(inputs):
            raise Unavailable(self.name, f"{len(vectors)} vectors for {len(inputs)} inputs")
        usage = self._usage(body.get("usage"), sum(estimate_tokens(t) for t in inputs), 0)
        return Embeddings(vectors, usage, self.name)

    async def chat(self, model: str, messages: Sequence[Message], *,
                   max_tokens: int | None = None) -> Completion:
        """The whole reply at once."""
        body = await self._post("/chat/completions",
                                self._chat_body(model, messages, max_tokens, stream=False))
        try:
            text = body["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise Unavailable(self.name, "malformed chat answer") from None
        usage = self._usage(body.get("usage"), estimate_messages(messages),
                            estimate_tokens(text))
        return Completion(str(text), usage, self.name)

    def stream_chat(self, model: str, messages: Sequence[Message], *,
                    max_tokens: int | None = None) -> ChatStream:
        """The reply as text deltas (SSE ``data:`` lines up to ``[DONE]``), usage at the end.
        Nothing is sent until the first delta is asked for."""
        stream = ChatStream(self.name)
        return stream.attach(self._deltas(model, messages, max_tokens, stream))

    # plumbing -------------------------------------------------------------
    def _chat_body(self, model: str, messages: Sequence[Message], max_tokens: int | None,
                   *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": [dict(m) for m in messages]}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key.get()}"
        return headers

    def _timeout(self, *, stream: bool) -> aiohttp.ClientTimeout:
        connect = self.config.connect_timeout_seconds
        if stream:  # a long reply is fine as long as chunks keep coming
            return aiohttp.ClientTimeout(total=None, connect=connect,
                                         sock_read=self.config.timeout_seconds)
        return aiohttp.ClientTimeout(total=self.config.timeout_seconds, connect=connect)

    def _masked(self, text: str) -> str:
        key = self.config.api_key.get() if self.config.api_key else ""
        if key:
            text = text.replace(key, "***")
        return text[:200]

    def _usage(self, raw: Any, prompt_estimate: int, completion_estimate: int) -> Usage:
        if isinstance(raw, Mapping):
            prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens", 0)
            if isinstance(prompt, int) and isinstance(completion, int | None):
                return Usage(prompt, completion or 0)
        return Usage(prompt_estimate, completion_estimate, estimated=True)

    async def _refusal(self, response: aiohttp.ClientResponse) -> ProviderError:
        """The typed error for a non-2xx answer, with the provider's message (masked)."""
        try:
            raw = (await _read_at_most(response, REFUSAL_BYTES))[0].decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError):
            raw = ""
        detail = raw
        try:
            error = json.loads(raw).get("error")
            detail = error.get("message", raw) if isinstance(error, dict) else str(error or raw)
        except (ValueError, AttributeError):
            pass
        detail = self._masked(str(detail))
        status = response.status
        if status == 429:
            return RateLimited(self.name, parse_retry_after(response.headers.get("Retry-After")),
                               detail)
        if status in _REJECTED:
            return Rejected(self.name, status, detail)
        return Unavailable(self.name, f"HTTP {status}{': ' + detail if detail else ''}")

    def _url(self, path: str) -> str:
        return self.config.base_url + path

    @contextlib.contextmanager
    def _failures(self) -> Iterator[None]:
        """Transport failures as ``Unavailable`` (the next provider may answer)."""
        try:
            yield
        except ProviderError:
            raise
        except TimeoutError:
            raise Unavailable(self.name, "timed out") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise Unavailable(self.name, f"connection failed ({type(exc).__name__})") from None

    def _too_large(self, what: str) -> Unavailable:
        return Unavailable(self.name, f"{what} larger than {self.config.max_answer_bytes} "
                                      "bytes (max_answer_bytes)")

    @contextlib.contextmanager
    def _long_lines(self) -> Iterator[None]:
        """aiohttp refuses a line past its buffer (``LineTooLong``; older aiohttp raised
        ``ValueError``): a malformed stream, so the next provider is tried."""
        try:
            yield
        except (ValueError, LineTooLong):
            raise Unavailable(self.name, "stream line too long") from None

    async def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            with self._failures():
                async with self.session.post(self._url(path), json=payload,
                                             headers=self._headers(),
                                             timeout=self._timeout(stream=False)) as response:
                    if response.status >= 300:
                        raise await self._refusal(response)
                    raw, over = await _read_at_most(response, self.config.max_answer_bytes)
                    if over:
                        raise self._too_large("answer")
                    body = json.loads(raw)
        except ValueError:
            raise Unavailable(self.name, "answer is not JSON") from None
        if not isinstance(body, dict):
            raise Unavailable(self.name, "answer is not a JSON object")
        return body

    async def _deltas(self, model: str, messages: Sequence[Message], max_tokens: int | None,
                      stream: ChatStream) -> AsyncIterator[str]:
        payload = self._chat_body(model, messages, max_tokens, stream=True)
        text: list[str] = []
        usage: Usage | None = None
        read = 0
        with self._failures(), self._long_lines():
            async with self.session.post(self._url("/chat/completions"), json=payload,
                                         headers={**self._headers(),
                                                  "Accept": "text/event-stream"},
                                         timeout=self._timeout(stream=True)) as response:
                if response.status >= 300:
                    raise await self._refusal(response)
                done = False
                async for raw in response.content:
                    read += len(raw)
                    if read > self.config.max_answer_bytes:
                        raise self._too_large("stream")
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue  # blank separators, ": keep-alive" comments, event: lines
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = self._chunk(data)
                    if chunk.get("usage"):
                        usage = self._usage(chunk["usage"], 0, 0)
                    for choice in chunk.get("choices") or ():
                        delta = (choice.get("delta") or {}).get("content")
                        if delta:
                            text.append(delta)
                            yield delta
                if not done:
                    raise Unavailable(self.name, "stream ended before [DONE]")
        stream.usage = usage if usage is not None and not usage.estimated else Usage(
                estimate_messages(messages), estimate_tokens("".join(text)), estimated=True)

    def _chunk(self, data: str) -> dict[str, Any]:
        try:
            chunk = json.loads(data)
        except ValueError:
            raise Unavailable(self.name, "stream chunk is not JSON") from None
        if not isinstance(chunk, dict):
            raise Unavailable(self.name, "stream chunk is not a JSON object")
        if chunk.get("error"):
            error = chunk["error"]
            message = error.get("message", "") if isinstance(error, dict) else str(error)
            raise Unavailable(self.name, f"error in stream: {self._masked(str(message))}")
        return chunk


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """Up to ``limit`` bytes of the body, and whether it was longer (the rest is not read)."""
    if response.content_length is not None and response.content_length > limit:
        return b"", True
    data = bytearray()
    while len(data) <= limit:
        chunk = await response.content.read(limit + 1 - len(data))
        if not chunk:
            return bytes(data), False
        data += chunk
    return bytes(data[:limit]), True
