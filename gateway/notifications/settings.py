"""Notification tunables, from the ``[notifications]`` table of the TOML configuration (all
optional): the retry schedule, when to give up on a row and on a subscription, what outbound
HTTP may reach, and the delivery loop's timings (tests shorten them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config import ConfigError, Settings, field_types, positive_numbers

# Delays after the 1st, 2nd, ... failure of a row; past the list, the last one repeats.
DEFAULT_RETRY_SECONDS = (5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0)
_FLAGS = ("allow_http", "allow_private_networks", "deliver")
_LIST = "retry_seconds"


@dataclass(frozen=True)
class NotificationSettings:
    # Whether this process delivers (false: it serves the API only, others deliver).
    deliver: bool = True
    retry_seconds: tuple[float, ...] = DEFAULT_RETRY_SECONDS
    # A row still failing this long after its first failure is recorded and skipped.
    give_up_after_seconds: float = 86400.0
    # A subscription failing this long without one success is paused.
    disable_after_seconds: float = 5 * 86400.0
    # Outbound HTTP: plain http and private/loopback/link-local... addresses only when set.
    allow_http: bool = False
    allow_private_networks: bool = False
    connect_seconds: float = 5.0
    request_seconds: float = 15.0
    max_answer_bytes: int = 64 * 1024
    # The longest 429 Retry-After waited as asked (a longer one waits this long).
    max_retry_after_seconds: float = 3600.0
    # Delivery: the safety poll of the feed heads (signals wake it at once), the lease on a
    # partition of the subscriptions, and how many partitions there are to share.
    poll_seconds: float = 2.0
    lease_seconds: float = 15.0
    # Outbound HTTP connections open at once per process (all endpoints together).
    max_connections: int = 256
    # POST /v1/topics/{topic}/events per credential and minute (the admin is not limited).
    events_per_minute: int = 600
    # Subscriptions one credential (an API key, an account) may hold (the admin: no limit).
    max_subscriptions_per_credential: int = 1000

    @classmethod
    def from_settings(cls, settings: Settings) -> NotificationSettings:
        """``gateway dev`` delivers to plain http and private addresses (a receiver on the
        same machine) unless the table says otherwise; ``serve`` does not."""
        section = settings.section("notifications")
        if settings.dev:
            section = {"allow_http": True, "allow_private_networks": True, **section}
        return cls.from_section(section)

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> NotificationSettings:
        label = "[notifications]"
        values: dict[str, Any] = positive_numbers(
            section, field_types(cls, exclude=(*_FLAGS, _LIST)), label, other=(*_FLAGS, _LIST))
        for flag in _FLAGS:
            if flag in section:
                if not isinstance(section[flag], bool):
                    raise ConfigError(f"{label}.{flag}", "must be true or false")
                values[flag] = section[flag]
        if _LIST in section:
            values[_LIST] = _schedule(section[_LIST], f"{label}.{_LIST}")
        return dataclasses.replace(cls(), **values)

    def retry_delay(self, failures: int) -> float:
        """The delay before the attempt after the ``failures``-th failure (1-based)."""
        schedule = self.retry_seconds
        return schedule[min(failures, len(schedule)) - 1]


def _schedule(raw: Any, label: str) -> tuple[float, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(label, "must be a non-empty list of seconds")
    try:
        delays = tuple(float(value) for value in raw)
    except (TypeError, ValueError):
        raise ConfigError(label, "must be a list of numbers") from None
    if any(delay <= 0 for delay in delays):
        raise ConfigError(label, "every delay must be positive")
    return delays
