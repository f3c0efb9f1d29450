"""Push tunables, from the ``[push]`` table of the TOML configuration (all optional)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import Settings, tunables


@dataclass(frozen=True)
class PushSettings:
    # Safety-net poll of the feed while pub/sub works (cures a signal lost in flight).
    poll_seconds: float = 5.0
    # Poll interval while redis-cache is unreachable: streams degrade, they do not die.
    degraded_poll_seconds: float = 1.0
    heartbeat_seconds: float = 15.0
    # Rows buffered per SSE client; a client that lets more pile up is disconnected.
    client_buffer_rows: int = 1000
    # A single write to a client that does not finish in this time disconnects it.
    write_timeout_seconds: float = 10.0
    subscribe_timeout_seconds: float = 2.0
    max_topics_per_stream: int = 50
    # Open streams: per client address, and per process (0: half the file-descriptor limit,
    # so idle streams can never take the descriptors the inbound routes need).
    max_streams_per_client: int = 100
    max_streams: int = 0
    page_rows: int = 500
    # Retention: rows older than this, or beyond the newest max_rows of a topic, are trimmed.
    retention_days: float = 30.0
    retention_max_rows: int = 1_000_000
    retention_interval_seconds: float = 600.0

    @classmethod
    def from_settings(cls, settings: Settings) -> PushSettings:
        return tunables(cls, settings, "push")
