"""The inbox's Lua scripts (``lua/*.lua`` behind ``lua/includes/prelude.lua``), registered
once per client and called by SHA (redis-py reloads a script the server forgot)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gateway.stores.redis import AnyRedis

LUA_DIR = Path(__file__).parent / "lua"
_PRELUDE = (LUA_DIR / "includes" / "prelude.lua").read_text()


@dataclass(frozen=True)
class InboxScripts:
    push: Any
    take: Any
    ack: Any
    release: Any
    renew: Any
    reclaim: Any


_SOURCES = {f.name: _PRELUDE + "\n" + (LUA_DIR / f"{f.name}.lua").read_text()
            for f in fields(InboxScripts)}
_CACHE: weakref.WeakKeyDictionary[Any, InboxScripts] = weakref.WeakKeyDictionary()


def inbox_scripts(client: AnyRedis) -> InboxScripts:
    found = _CACHE.get(client)
    if found is None:
        found = InboxScripts(**{name: client.register_script(text)
                                for name, text in _SOURCES.items()})
        _CACHE[client] = found
    return found
