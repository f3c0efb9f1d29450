"""Replay defences for signed webhooks, per source (TOML ``[webhooks.<source>]``).

GitHub signs the body and nothing else: not a timestamp, not ``X-GitHub-Delivery``, not
``X-GitHub-Event``. A captured delivery therefore stays valid forever, and a fresh delivery
id makes it look new to the delivery-id dedup. Two defences:

* **Body window** (``replay_window_seconds``, default 7 days for ``github`` sources, off for
  the others): the first delivery of a signed body marks ``dedup:webhook-body:<source>:<sha256
  of the body>`` with its delivery id. The same body under another delivery id within the
  window is answered ``duplicate`` (with the first delivery's item id) and nothing is
  enqueued; the same body under the same id (a GitHub redelivery keeps the id) goes on to the
  usual delivery-id dedup, so a redelivery after a failed enqueue is still taken in.
* **Freshness** (``freshness_fields``, off by default): a table naming, per event
  (``X-GitHub-Event``; ``"*"`` for any), the dotted path of a timestamp in the payload
  (ISO 8601 or Unix seconds), e.g. ``push = "repository.pushed_at"``. When set, every
  delivery must carry a timestamp at the path its event names, within
  ``freshness_tolerance_seconds`` (default 3600) of now, or it is refused with 400. The event
  header is unsigned, so an event without a listed path is refused rather than let through.

``standard`` and ``stripe`` sign a timestamp (±5 minutes) and an id (Standard Webhooks) or
have the body hash as id (Stripe), so their replays are bounded without either.

A GitHub source whose window is shorter than its tolerance (or off) is named in a warning
when the app starts: a delivery replayed between the two passes both defences.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway import keys
from gateway.api.errors import ApiError
from gateway.config import ConfigError, Settings
from gateway.stores.coalesce import AutoPipeline

log = logging.getLogger("gateway.webhooks")
_MARK = (Path(__file__).parent / "lua" / "replay_mark.lua").read_text()
DEFAULT_WINDOWS = {"github": 7 * 86400}
DEFAULT_TOLERANCE = 3600
ANY_EVENT = "*"
_LABEL = "GATEWAY_CONFIG [webhooks.{}]"


@dataclass(frozen=True)
class ReplayPolicy:
    """One source's replay settings; ``window`` 0 means no body window."""

    window: int = 0
    tolerance: int = DEFAULT_TOLERANCE
    fields: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def check_fresh(self, event: str | None, body: Any, now: float) -> None:
        """Refuse (400) a delivery without a timestamp within the tolerance, when freshness is
        configured; nothing otherwise."""
        if not self.fields:
            return
        path = self.fields.get(event or ANY_EVENT) or self.fields.get(ANY_EVENT)
        if path is None:
            raise ApiError(400, "no_timestamp",
                           f"event {str(event)[:60]!r} has no freshness field configured")
        dotted = ".".join(path)
        stamp = timestamp_at(body, path)
        if stamp is None:
            raise ApiError(400, "no_timestamp",
                           f"payload has no timestamp at {dotted} (ISO 8601 or Unix seconds)")
        age = now - stamp
        if abs(age) > self.tolerance:
            raise ApiError(400, "stale_delivery",
                           f"{dotted} is {int(age)} s from now, beyond the "
                           f"{self.tolerance} s tolerance")


def timestamp_at(body: Any, path: tuple[str, ...]) -> float | None:
    """The Unix time at ``path`` in the parsed payload, or None if absent or not a time."""
    value = body
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _seconds(label: str, name: str, raw: Any, minimum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
        raise ConfigError(f"{label}.{name}", f"must be an integer >= {minimum} (got {raw!r})")
    return raw


def _fields(label: str, raw: Any) -> dict[str, tuple[str, ...]]:
    table = {ANY_EVENT: raw} if isinstance(raw, str) else raw
    if not isinstance(table, Mapping):
        raise ConfigError(f"{label}.freshness_fields", "must be a table event = \"dotted.path\"")
    found: dict[str, tuple[str, ...]] = {}
    for event, dotted in table.items():
        parts = tuple(dotted.split(".")) if isinstance(dotted, str) else ()
        if not parts or not all(parts):
            raise ConfigError(f"{label}.freshness_fields.{event}",
                              "must be a dotted path such as repository.pushed_at")
        found[str(event)] = parts
    return found


def policy_for(settings: Settings, source: str) -> ReplayPolicy:
    """The policy of ``source`` from ``[webhooks.<source>]`` over the scheme's defaults."""
    scheme = settings.webhook_sources[source].scheme
    section = settings.section("webhooks").get(source, {})
    label = _LABEL.format(source)
    if not isinstance(section, Mapping):
        raise ConfigError(label, "must be a table")
    unknown = set(section) - {"replay_window_seconds", "freshness_fields",
                              "freshness_tolerance_seconds"}
    if unknown:
        raise ConfigError(f"{label}.{sorted(unknown)[0]}", "unknown setting")
    return ReplayPolicy(
        window=_seconds(label, "replay_window_seconds",
                        section.get("replay_window_seconds", DEFAULT_WINDOWS.get(scheme, 0)), 0),
        tolerance=_seconds(label, "freshness_tolerance_seconds",
                           section.get("freshness_tolerance_seconds", DEFAULT_TOLERANCE), 1),
        fields=_fields(label, section.get("freshness_fields", {})),
    )


def policies(settings: Settings) -> dict[str, ReplayPolicy]:
    """Every configured source's policy; a ``[webhooks.<name>]`` table for a source that is
    not configured is an error (a typo would otherwise switch a defence off silently)."""
    for name in settings.section("webhooks"):
        if name not in settings.webhook_sources:
            raise ConfigError(_LABEL.format(name), "no webhook source of that name is configured")
    found = {name: policy_for(settings, name) for name in settings.webhook_sources}
    for name, policy in found.items():
        if settings.webhook_sources[name].scheme == "github" and policy.window < policy.tolerance:
            log.warning("[webhooks.%s] replay_window_seconds (%d) is shorter than "
                        "freshness_tolerance_seconds (%d): a captured delivery replayed "
                        "between the two is taken in again; make the window at least the "
                        "tolerance", name, policy.window, policy.tolerance)
    return found


class ReplayGuard:
    """The body window's one write: mark a body with its first delivery id, or learn it."""

    def __init__(self, auto: AutoPipeline, settings: Settings) -> None:
        self.auto = auto
        self.policies = policies(settings)
        self._mark = auto.redis.register_script(_MARK)

    async def first_delivery(self, source: str, body: bytes, delivery_id: str,
                             window: int) -> str:
        """The delivery id under which this body first arrived within ``window`` seconds:
        ``delivery_id`` itself when it is the first (or a redelivery of the first)."""
        key = keys.dedup_webhook_body(source, hashlib.sha256(body).hexdigest())
        holder = await self.auto.run_script(self._mark, [key], [delivery_id, window])
        return holder.decode() if isinstance(holder, bytes) else str(holder)
