"""Search over embedded chunks, with answers cached in redis-cache.

Cache key: ``cache:<endpoint_hash>:<params_hash>`` where the params hash covers the query,
the limit, the mode, the configured embedder, the reader's scope (``Readable.key``: which owners'
documents it may read) and the current *generation*. Writes that add chunks
replace the generation (one SET: O(1) invalidation, no SCAN+DEL), which makes every older
answer unreachable. The
generation is a random token, not a counter: if redis-cache evicts it, a fresh random one is
drawn, so a lost generation only causes misses and can never resurrect an old answer.
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from gateway import keys
from gateway.knowledge import embedding, ranking
from gateway.knowledge.owners import Readable
from gateway.pipeline import metrics
from gateway.stores.redis import AnyRedis

ENDPOINT = "GET /v1/search"
ANSWER_TTL = 900
GENERATION_TTL = 7 * 24 * 3600
MAX_LIMIT = 50
MAX_QUERY = 500

_ENDPOINT_HASH = hashlib.sha256(ENDPOINT.encode()).hexdigest()[:12]

def generation_key() -> str:
    return keys.cache(_ENDPOINT_HASH, "generation")


def answer_key(generation: str, query: str, limit: int, embedder: str,
               readable: Readable, mode: str = ranking.DEFAULT_MODE) -> str:
    """The answer's key: the reader's scope is part of it, so an answer is only ever served
    to a reader who may read every document in it."""
    params = json.dumps([generation, query, limit, embedder, readable.key(), mode],
                        separators=(",", ":"))
    return keys.cache(_ENDPOINT_HASH, hashlib.sha256(params.encode()).hexdigest()[:32])


async def invalidate(cache: AnyRedis) -> None:
    """New chunks are committed: move to a new generation (O(1))."""
    await cache.set(generation_key(), secrets.token_hex(8), ex=GENERATION_TTL)


def invalidator(cache: AnyRedis) -> Callable[[], Awaitable[None]]:
    """``invalidate`` on ``cache`` as one callable per client: the embed stage registers it
    for each item, and the worker calls it once per committed batch."""
    found = _invalidators.get(id(cache))
    if found is None:  # an entry holds its client, so no other client can reuse the id
        found = functools.partial(invalidate, cache)
        _invalidators[id(cache)] = found
    return found


# Kept while a batch holds them: identity only matters within one batch.
_invalidators: weakref.WeakValueDictionary[int, Callable[[], Awaitable[None]]] = (
    weakref.WeakValueDictionary())


async def _generation(cache: AnyRedis) -> str:
    await cache.set(generation_key(), secrets.token_hex(8), ex=GENERATION_TTL, nx=True)
    value = await cache.get(generation_key())
    return str(value) if value else secrets.token_hex(8)


async def rank(runtime: Any, query: str, limit: int, readable: Readable,
               timeout: float | None = None,
               mode: str = ranking.DEFAULT_MODE) -> list[dict[str, Any]]:
    """The answer's entries for ``query`` in ``mode`` among the chunks ``readable`` allows
    (``ranking.ranked``); ``timeout`` cancels each statement on the server (asyncpg) past
    that many seconds."""
    return [hit.public() for hit in await ranking.ranked(runtime, query, limit, readable,
                                                         mode, timeout)]


async def lookup(runtime: Any, q: str, limit: int, readable: Readable,
                 mode: str = ranking.DEFAULT_MODE) -> tuple[str | None, Any]:
    """The answer cache's key for ``q`` read by ``readable`` in ``mode`` and its cached
    answer (None: a miss). A cache that is down or full only costs the cached answer, never
    the search: then the key is None too."""
    cache = runtime.cache
    try:
        key = answer_key(await _generation(cache), q, limit,
                         embedding.configured(runtime.settings), readable, mode)
        cached = await cache.get(key)
    except Exception:
        return None, None
    metrics.SEARCH_CACHE.labels("miss" if cached is None else "hit").inc()
    return key, None if cached is None else json.loads(cached)


async def remember(runtime: Any, key: str | None, results: list[dict[str, Any]]) -> None:
    """Cache an answer for 900 s (under its generation); a failing cache is ignored."""
    if key is not None:
        try:
            await runtime.cache.set(key, json.dumps(results), ex=ANSWER_TTL)
        except Exception:
            pass


async def search(runtime: Any, q: str, readable: Readable, limit: int = 10,
                 timeout: float | None = None,
                 mode: str = ranking.DEFAULT_MODE) -> list[dict[str, Any]]:
    """Ranked results for ``q`` among the documents ``readable`` allows, from the answer
    cache when it has them."""
    key, cached = await lookup(runtime, q, limit, readable, mode)
    if cached is not None:
        return list(cached)
    results = await rank(runtime, q, limit, readable, timeout, mode)
    await remember(runtime, key, results)
    return results
