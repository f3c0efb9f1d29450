"""``[connections]``: the caps and timeouts of client connections (the gate itself is
``gateway.web.connections``; the body timeout applies where bodies are read)."""

from __future__ import annotations

import resource
from dataclasses import dataclass

from gateway.config import Settings, tunables


@dataclass(frozen=True)
class ConnectionSettings:
    """``[connections]``. Defaults from the file-descriptor limit: ``max`` 60 % of it, and a
    ``reserve`` of 10 % more for the routes that need no credential, which leaves 30 % for
    the stores' pools, the listener and the process itself."""

    max: int = 0
    reserve: int = 0
    per_ip: int = 256
    idle_seconds: float = 15.0
    body_seconds: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionSettings:
        return tunables(cls, settings, "connections")

    def caps(self) -> tuple[int, int]:
        """(max, hard limit) in effect."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        most = self.max or max(32, soft * 3 // 5)
        return most, most + (self.reserve or max(16, soft // 10))
