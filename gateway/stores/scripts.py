"""Lua scripts registered once per Redis client: a room's dataclass of redis-py ``Script``
objects (called by SHA; redis-py reloads a script the server forgot), built on first use."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from typing import Any, TypeVar

from gateway.stores.redis import AnyRedis

T = TypeVar("T")
_CACHE: weakref.WeakKeyDictionary[Any, dict[type, Any]] = weakref.WeakKeyDictionary()


def bound_scripts(client: AnyRedis, cls: type[T], sources: Mapping[str, str]) -> T:
    """``cls(**{name: client.register_script(source)})``, once per client and class."""
    per_client = _CACHE.setdefault(client, {})
    found = per_client.get(cls)
    if found is None:
        found = per_client[cls] = cls(**{name: client.register_script(text)
                                         for name, text in sources.items()})
    return found


def bound_to(client: AnyRedis) -> list[Any]:
    """Every script bound to ``client`` so far (each once), for loading them ahead of use
    (``gateway.stores.warm``)."""
    found: dict[str, Any] = {}
    for scripts in _CACHE.get(client, {}).values():
        for field in dataclasses.fields(scripts):
            script = getattr(scripts, field.name)
            found.setdefault(script.sha, script)
    return list(found.values())
