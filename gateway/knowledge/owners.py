"""Who may read which documents: the owner filter of every search, as SQL.

A document belongs to a namespace (``gateway.keys.document_owner``). A reader reads its own
namespace's documents and those of every owner whose topic ``docs:<owner>`` one of its topic
patterns matches (a name, or a prefix ending in ``*``: ``docs:*`` and ``*`` read every
document). ``Readable`` is that set, computed once per reader; ``sql`` turns it into a
condition on the chunk's ``owner`` column that goes inside the search's own statement, so
the database returns ``limit`` readable chunks instead of ``limit`` chunks of which a few
are readable. ``key`` names it canonically, for the answer cache: two readers with the same
set share answers, two with different sets never do.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

DOCS_TOPIC = "docs:"


def docs_topic(owner: str) -> str:
    """The topic whose readers may read ``owner``'s documents."""
    return DOCS_TOPIC + owner


@dataclass(frozen=True)
class Readable:
    """Every owner (``everything``), or the owners named and those starting with a prefix."""

    everything: bool = False
    owners: frozenset[str] = frozenset()
    prefixes: frozenset[str] = frozenset()

    @classmethod
    def of(cls, own: str | None, patterns: Iterable[str]) -> Readable:
        """A reader whose own namespace is ``own`` (None: it has none) and whose topic
        patterns are ``patterns``."""
        owners = {own} if own else set()
        prefixes: set[str] = set()
        for pattern in patterns:
            if pattern.endswith("*"):
                prefix = pattern[:-1]
                if DOCS_TOPIC.startswith(prefix):  # "*", "docs:*": every docs: topic
                    return EVERYTHING
                if prefix.startswith(DOCS_TOPIC):
                    prefixes.add(prefix[len(DOCS_TOPIC):])
            elif pattern.startswith(DOCS_TOPIC) and len(pattern) > len(DOCS_TOPIC):
                owners.add(pattern[len(DOCS_TOPIC):])
        # An owner a prefix already covers adds nothing: one canonical form per set.
        owners = {o for o in owners if not any(o.startswith(p) for p in prefixes)}
        return cls(False, frozenset(owners), frozenset(prefixes))

    def allows(self, owner: str) -> bool:
        return self.everything or owner in self.owners or any(
            owner.startswith(p) for p in self.prefixes)

    @property
    def nothing(self) -> bool:
        return not (self.everything or self.owners or self.prefixes)

    def key(self) -> str:
        """A short canonical name of the set (for cache keys)."""
        if self.everything:
            return "*"
        canonical = json.dumps([sorted(self.owners), sorted(self.prefixes)],
                               separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:24]

    def sql(self, column: str, first: int) -> tuple[str, list[object]]:
        """``(condition, parameters)``: the condition on ``column`` (numbered parameters from
        ``$first``) that holds for readable rows. ``everything`` is ``TRUE`` with no
        parameter, so that reader's statement is the unfiltered one."""
        if self.everything:
            return "TRUE", []
        parts: list[str] = []
        params: list[object] = []
        if self.owners or not self.prefixes:
            parts.append(f"{column} = ANY(${first}::text[])")
            params.append(sorted(self.owners))
        if self.prefixes:
            # ^@ is starts_with as an operator: ANY takes it, and it stays a plain condition
            # on the row (a subquery over the prefixes would turn the walk into a join).
            parts.append(f"{column} ^@ ANY(${first + len(params)}::text[])")
            params.append(sorted(self.prefixes))
        return "(" + " OR ".join(parts) + ")", params


EVERYTHING = Readable(everything=True)
