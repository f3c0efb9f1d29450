"""Per-owner quotas: what one credential, or one webhook source, may hold in the pipeline
at once (items and payload bytes), so that no single sender can take redis-durable's memory
from the others, whatever the instance-wide admission (``admission.py``) still allows.

The count lives with the items (``q:{pipeline}:quota:<owner>``, kept by the ADD script in
the same call that enqueues): an item counts from its acceptance until it leaves the
pipeline (done or dead-lettered). Past either limit a submission is answered ``429
quota_exceeded`` + ``Retry-After`` and nothing is written. The admin token has none.

TOML ``[quotas]``: ``items_per_credential`` (10,000), ``bytes_per_credential``,
``items_per_source`` (50,000), ``bytes_per_source``; 0 turns a limit off. The byte quotas
scale with redis-durable's ``maxmemory`` when not set: a tenth of it per credential, a fifth
per webhook source (64 and 128 MiB on a 640 MiB instance; those figures without
``maxmemory``), so one sender never holds more than a slice of a small instance."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.api.errors import ApiError
from gateway.config import ConfigError
from gateway.pipeline.queue import Quota

RETRY_SECONDS = 30  # items leave at the pipeline's pace, not in an instant


# Unset byte quotas: this share of maxmemory, or the fixed figure without one.
CREDENTIAL_SHARE, SOURCE_SHARE = 0.10, 0.20
UNBOUNDED_CREDENTIAL_BYTES, UNBOUNDED_SOURCE_BYTES = 64 * 2**20, 128 * 2**20
_UNKNOWN = object()


@dataclass(frozen=True)
class QuotaSettings:
    items_per_credential: int = 10_000
    bytes_per_credential: int | None = None  # None: scaled with maxmemory
    items_per_source: int = 50_000
    bytes_per_source: int | None = None
    _sources: dict[tuple[str, int | None], Quota | None] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> QuotaSettings:
        values: dict[str, int] = {}
        for name, raw in section.items():
            if name not in cls.__dataclass_fields__ or name.startswith("_"):
                raise ConfigError(f"[quotas].{name}", "unknown setting")
            if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
                raise ConfigError(f"[quotas].{name}", f"must be a whole number >= 0 (got {raw!r})")
            values[name] = raw
        return cls(**values)

    def for_credential(self, owner: str, maxmemory: int | None = None) -> Quota | None:
        """The quota of a credential's namespace (None for the admin's, or when off), its
        bytes scaled with ``maxmemory`` unless set."""
        return _quota(owner, self.items_per_credential, _bytes(
            self.bytes_per_credential, CREDENTIAL_SHARE, UNBOUNDED_CREDENTIAL_BYTES, maxmemory))

    def for_source(self, source: str, maxmemory: int | None = None) -> Quota | None:
        """Asked on every signed webhook: kept per source and ``maxmemory``."""
        known = self._sources.get((source, maxmemory), _UNKNOWN)
        if known is not _UNKNOWN:
            return known  # type: ignore[return-value]
        if len(self._sources) >= 1024:
            self._sources.clear()
        quota = self._sources[source, maxmemory] = _quota(
            f"src.{source}", self.items_per_source,
            _bytes(self.bytes_per_source, SOURCE_SHARE, UNBOUNDED_SOURCE_BYTES, maxmemory))
        return quota


def _bytes(configured: int | None, share: float, unbounded: int, maxmemory: int | None) -> int:
    if configured is not None:
        return configured
    return max(1, int(share * maxmemory)) if maxmemory else unbounded


def _quota(owner: str, items: int, size: int) -> Quota | None:
    return Quota(owner, items, size) if owner and (items or size) else None


def exceeded() -> ApiError:
    return ApiError(429, "quota_exceeded",
                    "this sender holds its quota of queued items or bytes; retry once some "
                    "are processed", {"Retry-After": str(RETRY_SECONDS)})
