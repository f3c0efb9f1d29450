"""How many hash tags the pipeline's keys spread over, per redis-durable client.

One tag is one Redis Cluster slot, so with the single ``{pipeline}`` tag one master carries
every queue command. With ``GATEWAY_PIPELINE_SHARDS`` = N > 1 an item lives in shard
``blake2b(item id) mod N`` from its ADD to its end (every stage of it: COMPLETE moves it
within its shard), each shard a whole pipeline under its own tag (``keys.shard_tag``; shard 0
is ``{pipeline}`` itself, so one shard is today's layout and what was written before sharding
is shard 0's). A lease names the shard it came from, so the scripts that follow a FETCH go
where the item is, whatever its id hashes to now.

The count belongs to the redis-durable client (``gateway/stores/shards.py``).
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

from gateway import keys
from gateway.pipeline.stages import TAG
from gateway.stores.shards import configure, count_of

# Where the next FETCH of a stage starts, per client: each call begins one shard further.
_STARTS: weakref.WeakKeyDictionary[Any, dict[str, itertools.count[int]]] = \
    weakref.WeakKeyDictionary()


def tags_of(client: Any) -> tuple[str, ...]:
    """Every shard's tag, shard 0 (``{pipeline}``) first."""
    return keys.shard_tags(TAG, count_of(client))


def item_tag(item_id: str, count: int) -> str:
    """The tag of the shard a new item goes to."""
    return keys.shard_tag(TAG, keys.shard_index(item_id, count), count)


def homes(client: Any, item_id: str) -> tuple[str, ...]:
    """Where an item may be: the shard its id hashes to, then shard 0 (an item added before
    the pipeline was sharded stays there)."""
    count = count_of(client)
    tag = item_tag(item_id, count) if count > 1 else TAG
    return (tag,) if tag == TAG else (tag, TAG)


def fetch_order(client: Any, stage: str) -> tuple[str, ...]:
    """The shards' tags in the order one FETCH asks them: from a start that moves on by one
    every call, so every shard comes first as often as the others."""
    tags = tags_of(client)
    if len(tags) == 1:
        return tags
    starts = _STARTS.setdefault(client, {})
    start = next(starts.setdefault(stage, itertools.count())) % len(tags)
    return tags[start:] + tags[:start]


__all__ = ["configure", "count_of", "fetch_order", "item_tag", "tags_of"]
