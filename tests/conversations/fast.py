"""Fast limits and retry timings so conversation and adapter tests stay bounded."""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.config import Settings

FAST_LIMITS: dict[str, Any] = {
    "platforms": {
        "telegram": {"bot": {"rate": 1000, "period": 1, "burst": 1000},
                     "chat": {"rate": 1000, "period": 1, "burst": 1000}},
        "slack": {"channel": {"rate": 1000, "period": 1, "burst": 1000}},
        "mattermost": {"bot": {"rate": 1000, "period": 1, "burst": 1000}},
    },
}


def with_sections(settings: Settings, **sections: Any) -> Settings:
    """``settings`` with fast limits and retries, plus any extra TOML sections."""
    merged = {"ratelimit": FAST_LIMITS, "outbound": {"backoff": 0.01, "attempts": 3},
              **sections}
    return dataclasses.replace(settings, sections=merged)
