"""The one module that talks Redis pub/sub for push signals (DESIGN §4).

Keeping PUBLISH (and, later, SUBSCRIBE) here means sharded pub/sub (SPUBLISH/SSUBSCRIBE on
Redis Cluster) can replace them in one place.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from gateway import keys
from gateway.redis_clients import AnyRedis

log = logging.getLogger("gateway.push")


def signal_body(topic: str, offset: int, kind: str, epoch: int) -> str:
    return json.dumps({"topic": topic, "offset": offset, "kind": kind, "epoch": epoch},
                      separators=(",", ":"))


def parse_signal(data: Any) -> dict[str, Any] | None:
    """A signal as a dict, or None when it is not one of ours (never raises)."""
    try:
        body = json.loads(data)
        if (isinstance(body, dict) and isinstance(body.get("topic"), str)
                and isinstance(body.get("offset"), int) and isinstance(body.get("epoch"), int)):
            return body
    except (TypeError, ValueError):
        pass
    return None


async def publish_signal(cache: AnyRedis, topic: str, offset: int, kind: str,
                         epoch: int) -> bool:
    """PUBLISH on ``push:<topic>``. Pub/sub is at-most-once anyway, so a failure is logged
    and swallowed: polling the feed cures a lost signal. Returns whether it was sent."""
    try:
        await cache.publish(keys.push_channel(topic), signal_body(topic, offset, kind, epoch))
        return True
    except Exception as exc:  # redis down, OOM, timeout: never fail the committed write
        log.warning("push signal for %s:%s not sent: %s", topic, offset, type(exc).__name__)
        return False
