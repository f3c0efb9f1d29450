"""Who a request is: the admin (every scope, every topic), an API key or an access token with
its scopes and topic patterns."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from gateway import keys

SCOPES = ("jobs:write", "jobs:read", "jobs:critical", "search:read", "feed:read",
          "metrics:read", "admin", "tokens:issue", "events:write", "subscriptions:write")


def topic_matches(pattern: str, topic: str) -> bool:
    """A pattern is a topic name, or a prefix ending in ``*``."""
    if pattern.endswith("*"):
        return topic.startswith(pattern[:-1])
    return pattern == topic


@dataclass(frozen=True)
class Principal:
    kind: str  # "admin", "apikey" or "token"
    id: str  # "admin", the key's id, or the token's sub
    scopes: frozenset[str]
    topics: tuple[str, ...] = ()
    jti: str | None = None
    expires_at: float | None = None
    issued_at: float | None = None
    revocation_mark: str | None = None  # left for the route's own write to check

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"

    @property
    def account(self) -> str | None:
        """The account (a token's ``sub``) that chats can be linked to."""
        return self.id if self.kind == "token" else None

    @functools.cached_property
    def owner(self) -> str:
        """The namespace of what this principal submits (job ids): the admin's is the
        global one; a key's and an account's are their own. Computed once per principal
        (a verified token's principal is cached, so once per token)."""
        if self.is_admin:
            return ""
        if self.kind == "apikey":
            return keys.key_namespace(self.id)
        return keys.owner_namespace(self.id)

    def allows(self, scope: str) -> bool:
        return self.is_admin or scope in self.scopes

    def may_read(self, topic: str) -> bool:
        return self.is_admin or any(topic_matches(p, topic) for p in self.topics)


ADMIN = Principal("admin", "admin", frozenset(SCOPES), ("*",))


def _scope_names(value: str) -> frozenset[str]:
    return frozenset(s for s in value.replace(",", " ").split() if s)


def parse_scopes(value: str) -> frozenset[str]:
    """Space- or comma-separated scope names; unknown ones are refused (a typo would
    otherwise grant nothing, silently): for what an operator or an issuer asks for."""
    scopes = _scope_names(value)
    unknown = sorted(scopes - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown scope(s): {', '.join(unknown)} (known: {', '.join(SCOPES)})")
    return scopes


def known_scopes(value: str) -> frozenset[str]:
    """The gateway's scopes among a token's ``scope`` claim; the others are ignored: an
    identity provider's token carries its own (``openid profile``), and they grant nothing
    here."""
    return _scope_names(value) & frozenset(SCOPES)


def parse_topics(value: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in value.split(",") if t.strip())
