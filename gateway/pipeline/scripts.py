"""The pipeline's Lua scripts: read from ``lua/*.lua`` with the shared prelude prepended,
registered once per client and called by SHA (redis-py reloads them on ``NOSCRIPT``, and a
pipeline checks ``SCRIPT EXISTS`` before it executes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.stores.redis import AnyRedis
from gateway.stores.scripts import bound_scripts

LUA_DIR = Path(__file__).parent / "lua"
NAMES = ("add", "fetch", "heartbeat", "complete", "fail", "reclaim", "requeue", "release",
         "purge", "upgrade", "claim_add", "guard_add", "delay")
# Scripts that call another script's body as a local function: name -> (function, script).
_EMBEDS = {"claim_add": ("add_item", "add"), "guard_add": ("add_item", "add")}


def source(name: str) -> str:
    prelude = (LUA_DIR / "includes" / "prelude.lua").read_text()
    body = (LUA_DIR / f"{name}.lua").read_text()
    if name in _EMBEDS:
        function, embedded = _EMBEDS[name]
        body = (f"local function {function}()\n{(LUA_DIR / f'{embedded}.lua').read_text()}"
                f"end\n{body}")
    return prelude + "\n" + body


_SOURCES = {name: source(name) for name in NAMES}


@dataclass(frozen=True)
class Scripts:
    add: Any
    fetch: Any
    heartbeat: Any
    complete: Any
    fail: Any
    reclaim: Any
    requeue: Any
    release: Any
    purge: Any
    upgrade: Any
    claim_add: Any
    guard_add: Any
    delay: Any


def scripts_for(client: AnyRedis) -> Scripts:
    """The script objects bound to ``client`` (built once per client)."""
    return bound_scripts(client, Scripts, _SOURCES)
