"""What a provider call can end in, typed so each caller picks its answer: the chain retries
``RateLimited`` on the same provider and moves past ``Unavailable``; callers see only
``ChainFailed`` (the bot apologises) and ``OverBudget`` (the bot says so, the embed stage
delays the item). No message here ever holds an API key: they are built from the provider's
name, the HTTP status and the provider's own error text with the key masked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class ProviderError(Exception):
    """Any failure of a model provider call."""


class RateLimited(ProviderError):
    """The provider answered 429; ``retry_after`` is its ``Retry-After`` in seconds, if any."""

    def __init__(self, provider: str, retry_after: float | None, detail: str = "") -> None:
        super().__init__(f"{provider}: rate limited (429){': ' + detail if detail else ''}")
        self.provider = provider
        self.retry_after = retry_after


class Unavailable(ProviderError):
    """A 5xx, a timeout, a refused or broken connection, an unusable answer, or a refusal
    of this provider's credentials or model: the next provider of the chain may do better."""

    def __init__(self, provider: str, reason: str) -> None:
        super().__init__(f"{provider}: {reason}")
        self.provider = provider
        self.reason = reason


class Rejected(ProviderError):
    """The provider refused the request itself (400, 422): another would refuse it too."""

    def __init__(self, provider: str, status: int, detail: str = "") -> None:
        super().__init__(f"{provider}: request refused ({status}){': ' + detail if detail else ''}")
        self.provider = provider
        self.status = status


class ChainFailed(ProviderError):
    """Every provider of the chain failed; ``failures`` holds each one's error, in order."""

    def __init__(self, failures: Sequence[ProviderError]) -> None:
        super().__init__("no provider answered: " + "; ".join(str(f) for f in failures))
        self.failures = tuple(failures)


@dataclass(frozen=True)
class Budget:
    """One exhausted budget: ``scope`` is ``chat``, ``account`` or ``total``."""

    scope: str
    used: int
    limit: int


class OverBudget(ProviderError):
    """A ``[budgets]`` daily limit is reached: nothing was sent to any provider."""

    def __init__(self, budget: Budget) -> None:
        super().__init__(f"daily token budget reached ({budget.scope}: "
                         f"{budget.used} of {budget.limit})")
        self.budget = budget
