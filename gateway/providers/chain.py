"""A chain of providers: the one way the gateway calls a model.

Every attempt passes the ``rl:`` limiter of its provider (a concurrent slot, then a request
and the estimated tokens in one instant; the tokens are corrected from the reported usage
afterwards). A ``429`` waits its ``Retry-After`` (at most ``max_retry_after_seconds``, at most
``retries_on_429`` times; the slot is given back while waiting) and retries the same
provider. A 429's ``Retry-After`` also becomes the provider's cool-down in ``rl:``, written
before the attempt's slot is given back: every caller on every replica waits it out in the
limiter (read in its admission script, no round trip of its own), or, when more of it is left
than ``max_retry_after_seconds``, moves on to the next provider at once without calling.
A ``5xx``, a timeout, a refused connection or a refused key moves on to the next
provider; a request the provider calls malformed (400, 422) stops, since every provider would
refuse it. Callers see ``ChainFailed`` when nothing answered (the bot apologises) and
``OverBudget`` when a ``[budgets]`` limit is reached (checked once before the first attempt).
A stream falls back only until its first delta: after that the words are in the chat, and a
failure ends it with ``ChainFailed``. A stream ended early (by that failure, or by the caller
closing it or cancelling the task that reads it) is counted on an estimate of what was sent:
the provider worked for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from gateway.providers.client import (
    ChatStream,
    Completion,
    Embeddings,
    Message,
    OpenAIClient,
    Usage,
    estimate_messages,
    estimate_tokens,
)
from gateway.providers.errors import ChainFailed, ProviderError, RateLimited, Rejected
from gateway.providers.usage import Charge, UsageLedger
from gateway.ratelimit.limiter import CoolingDown
from gateway.ratelimit.limits import Providers, Ticket

log = logging.getLogger(__name__)

T = TypeVar("T", Embeddings, Completion)

# What a chat reply is assumed to cost before it is known, when no max_tokens is given.
REPLY_ESTIMATE = 256
NOBODY = Charge()  # a call charged to no chat, job or account (only the total budget)


class Chain:
    """Providers tried in order for one kind of work (a bot's replies, an embedder)."""

    def __init__(self, clients: Sequence[OpenAIClient], limits: Providers,
                 ledger: UsageLedger | None = None) -> None:
        if not clients:
            raise ValueError("a chain needs at least one provider")
        self.clients = tuple(clients)
        self.limits = limits
        self.ledger = ledger

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(client.name for client in self.clients)

    def __repr__(self) -> str:
        return f"Chain({list(self.names)!r})"

    async def embeddings(self, model: str, inputs: Sequence[str], *,
                         charge: Charge = NOBODY) -> Embeddings:
        """One vector per input, from the first provider that answers (none for no input,
        without a call)."""
        if not inputs:
            return Embeddings([], Usage(0), "")
        estimate = sum(estimate_tokens(text) for text in inputs)
        return await self._first("embeddings", model, estimate, charge,
                                 lambda client: client.embeddings(model, inputs))

    async def chat(self, model: str, messages: Sequence[Message], *,
                   charge: Charge = NOBODY, max_tokens: int | None = None) -> Completion:
        """The whole reply, from the first provider that answers."""
        estimate = estimate_messages(messages) + (max_tokens or REPLY_ESTIMATE)
        return await self._first("chat", model, estimate, charge,
                                 lambda client: client.chat(model, messages,
                                                            max_tokens=max_tokens))

    def stream_chat(self, model: str, messages: Sequence[Message], *,
                    charge: Charge = NOBODY, max_tokens: int | None = None) -> ChatStream:
        """The reply as text deltas; ``provider`` and ``usage`` are set once it has ended.
        Nothing is checked or sent until the first delta is asked for."""
        stream = ChatStream()
        return stream.attach(self._stream(stream, model, messages, charge, max_tokens))

    # plumbing -------------------------------------------------------------
    async def _record(self, client: OpenAIClient, model: str, kind: str, usage: Usage,
                      charge: Charge) -> None:
        if self.ledger is not None:
            await self.ledger.record(provider=client.name, model=model, kind=kind,
                                     usage=usage, charge=charge)

    def _submit(self, client: OpenAIClient, model: str, kind: str, usage: Usage,
                charge: Charge) -> asyncio.Future[None] | None:
        if self.ledger is None:
            return None
        return self.ledger.submit(provider=client.name, model=model, kind=kind, usage=usage,
                                  charge=charge)

    async def _settle(self, ticket: Ticket, client: OpenAIClient, model: str, charge: Charge,
                      usage: Usage) -> None:
        """A stream's end: its tokens settled in the limiter and its usage row written."""
        await ticket.settle(usage.total)
        await self._record(client, model, "chat", usage, charge)

    async def _admit(self, client: OpenAIClient, estimate: int) -> Ticket:
        """One attempt admitted by ``client``'s limits. A cool-down longer than this
        provider's ``max_retry_after_seconds`` is that provider's ``RateLimited`` without a
        call. The caller gives the slot back with ``_release``."""
        try:
            return await self.limits.admit(client.name, tokens=estimate,
                                           max_cooldown=client.config.max_retry_after_seconds)
        except CoolingDown as cooling:
            raise RateLimited(client.name, cooling.seconds,
                              "cooling down after a 429") from None

    async def _release(self, client: OpenAIClient, ticket: Ticket,
                       error: BaseException | None) -> None:
        """An attempt's end: a 429 with ``Retry-After`` becomes the provider's cool-down
        before the slot is given back, so no caller that waited for the slot calls in
        between; then the settled tokens and the slot go out with the limiter's next flush,
        not waited for (``Ticket.finish_nowait``: the call's answer does not depend on it)."""
        try:
            if isinstance(error, RateLimited) and error.retry_after:
                await self._cool_down(client, error.retry_after)
        finally:
            ticket.finish_nowait()

    async def _cool_down(self, client: OpenAIClient, seconds: float) -> None:
        try:
            await self.limits.cool_down(client.name, seconds)
        except Exception as exc:  # the 429 is still waited out by the one that got it
            log.warning("%s: cool-down of %.1f s not recorded: %s", client.name, seconds, exc)

    async def _go_on(self, client: OpenAIClient, error: ProviderError, retried: int,
                     failures: list[ProviderError]) -> bool:
        """After a failed attempt: True to retry ``client`` (its 429 has been waited out),
        False to move on to the next provider; ``ChainFailed`` when no provider can help."""
        if isinstance(error, RateLimited):
            config = client.config
            wait = (error.retry_after if error.retry_after is not None
                    else min(2.0 ** retried, 8.0))
            if retried < config.retries_on_429 and wait <= config.max_retry_after_seconds:
                log.info("%s: 429, retrying in %.1f s", client.name, wait)
                await asyncio.sleep(wait)
                return True
        failures.append(error)
        if isinstance(error, Rejected):
            raise ChainFailed(failures) from None
        log.warning("%s failed, next provider: %s", client.name, error)
        return False

    async def _first(self, kind: str, model: str, estimate: int, charge: Charge,
                     call: Callable[[OpenAIClient], Awaitable[T]]) -> T:
        if self.ledger is not None:
            await self.ledger.check(charge)
        failures: list[ProviderError] = []
        for client in self.clients:
            retried = 0
            while True:
                try:
                    ticket = await self._admit(client, estimate)
                    try:
                        result = await call(client)
                        await ticket.settle(result.usage.total)
                        written = self._submit(client, model, kind, result.usage, charge)
                    except BaseException as error:
                        await self._release(client, ticket, error)
                        raise
                    ticket.finish_nowait()
                except ProviderError as error:
                    if await self._go_on(client, error, retried, failures):
                        retried += 1
                        continue
                    break
                if written is not None and self.ledger is not None:
                    await self.ledger.stored(written, kind, client.name)
                return result
        raise ChainFailed(failures)

    async def _stream(self, stream: ChatStream, model: str, messages: Sequence[Message],
                      charge: Charge, max_tokens: int | None) -> AsyncIterator[str]:
        if self.ledger is not None:
            await self.ledger.check(charge)
        estimate = estimate_messages(messages) + (max_tokens or REPLY_ESTIMATE)
        failures: list[ProviderError] = []
        for client in self.clients:
            retried = 0
            while True:
                sent: list[str] = []
                try:
                    ticket = await self._admit(client, estimate)
                    failed: BaseException | None = None
                    try:
                        inner = client.stream_chat(model, messages, max_tokens=max_tokens)
                        try:
                            async for delta in inner:
                                sent.append(delta)
                                yield delta
                        except (GeneratorExit, asyncio.CancelledError, ProviderError):
                            if sent:  # ended early (closed or cancelled by the caller, or
                                # by the provider): it has worked for what it sent, so it
                                # is counted
                                await self._settle(ticket, client, model, charge, Usage(
                                    estimate_messages(messages),
                                    estimate_tokens("".join(sent)), estimated=True))
                            raise
                        finally:
                            await inner.aclose()
                        usage = inner.usage or Usage(estimate, 0, estimated=True)
                        await self._settle(ticket, client, model, charge, usage)
                    except BaseException as error:
                        failed = error
                        raise
                    finally:
                        await self._release(client, ticket, failed)
                except ProviderError as error:
                    if sent:  # the first words are out: no other provider can continue
                        raise ChainFailed([*failures, error]) from None
                    if await self._go_on(client, error, retried, failures):
                        retried += 1
                        continue
                    break
                stream.provider, stream.usage = client.name, usage
                return
        raise ChainFailed(failures)
