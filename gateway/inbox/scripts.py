"""The inbox's Lua scripts (``lua/*.lua`` behind ``lua/includes/prelude.lua``), registered
once per client and called by SHA (redis-py reloads a script the server forgot)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gateway.stores.redis import AnyRedis
from gateway.stores.scripts import bound_scripts

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


def inbox_scripts(client: AnyRedis) -> InboxScripts:
    return bound_scripts(client, InboxScripts, _SOURCES)
