"""Shared rate limits in ``rl:``: ``Limiter`` (sliding window and concurrency
slots on Redis time), the platform limits every outbound message passes, and ``Providers``,
the budget handlers use when they call model providers."""

from gateway.ratelimit.limiter import CoolingDown, Decision, Limiter, LimitError, Window
from gateway.ratelimit.limits import (
    PLATFORM_LIMITS,
    PROVIDER_LIMITS,
    ProviderLimits,
    Providers,
    Rate,
    Ticket,
    platform_limits,
    provider_limits,
)

__all__ = [
    "PLATFORM_LIMITS",
    "PROVIDER_LIMITS",
    "CoolingDown",
    "Decision",
    "LimitError",
    "Limiter",
    "ProviderLimits",
    "Providers",
    "Rate",
    "Ticket",
    "Window",
    "platform_limits",
    "provider_limits",
]
