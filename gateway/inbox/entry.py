"""What the inbox keeps per message: the platform-neutral message and how to answer it.

``route`` holds what the reply needs beyond the chat itself (a Slack command's
``response_url``, the Mattermost post a reply refers to); it is the adapter's to fill and
read. The JSON is compact and keys are sorted so that one entry always encodes the same.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from gateway.conversations.model import Incoming

VERSION = 1
_INCOMING_FIELDS = tuple(f.name for f in dataclasses.fields(Incoming))
# json.dumps with these options builds an encoder per call; this one is built once.
_ENCODE = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode


class BadEntry(ValueError):
    """An entry that cannot be decoded (written by a newer version, or damaged)."""


@dataclass(frozen=True)
class Entry:
    incoming: Incoming
    route: dict[str, str] = field(default_factory=dict)

    def encode(self) -> str:
        # Incoming's fields are all str or None: a shallow dict is ``asdict``'s result,
        # without its recursive deep copy (a third of the encoding's time).
        incoming = {name: getattr(self.incoming, name) for name in _INCOMING_FIELDS}
        return _ENCODE({"v": VERSION, "incoming": incoming, "route": self.route})

    @classmethod
    def decode(cls, raw: str | bytes) -> Entry:
        try:
            data: Any = json.loads(raw)
            if data.get("v") != VERSION:
                raise BadEntry(f"unknown inbox entry version {data.get('v')!r}")
            route = data.get("route") or {}
            if not all(isinstance(v, str) for v in route.values()):
                raise BadEntry("route values must be strings")
            return cls(Incoming(**data["incoming"]), dict(route))
        except BadEntry:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise BadEntry(f"undecodable inbox entry: {exc}") from None
