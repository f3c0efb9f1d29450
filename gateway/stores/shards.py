"""How many hash tags the pipeline's keys spread over, kept per redis-durable client.

The count belongs to the client (``configure``, done by ``open_runtime`` from
``GATEWAY_PIPELINE_SHARDS``): the pipeline's functions all take the client, and a client made
elsewhere (tests, tools) has one shard, the ``{pipeline}`` keys. ``gateway/pipeline/shards.py``
says what a shard is.
"""

from __future__ import annotations

import weakref
from typing import Any

_COUNTS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def configure(client: Any, count: int) -> None:
    """Spread the pipeline over ``count`` tags on ``client`` (1: the ``{pipeline}`` keys)."""
    if count < 1:
        raise ValueError("a pipeline has at least one shard")
    _COUNTS[client] = count


def count_of(client: Any) -> int:
    return _COUNTS.get(client, 1)
