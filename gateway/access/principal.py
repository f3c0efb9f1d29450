"""Who a request is: the admin (every scope, every topic), an API key or an access token with
its scopes and topic patterns, and, for what an issuer minted, where it came from.

A token minted through ``POST /v1/auth/token`` names the credentials it derives from
(``issued_by``: ``key:<id>``, ``sub:<sub>``, ``jti:<jti>``, ``fam:<refresh family>``):
revoking any of them ends it. ``link_topics`` bounds what its chat links grant: the topics
its issuer could read itself (None: no bound, as for the admin's or the issuer's own
account)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from gateway import keys
from gateway.pipeline.stages import progress_topic
from gateway.push.protocol import covers as covers  # re-exported: the access room's vocabulary
from gateway.push.protocol import topic_matches as topic_matches

SCOPES = ("jobs:write", "jobs:read", "jobs:priority", "jobs:critical", "search:read",
          "feed:read", "metrics:read", "admin", "tokens:issue", "events:write",
          "subscriptions:write")


MAX_ISSUERS = 12  # how many credentials a token may derive from: minting stops that deep


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
    subs: tuple[str, ...] = ()  # an API key's: the accounts it may mint tokens for
    issued_by: tuple[str, ...] = ()  # the credentials a minted token derives from
    link_topics: tuple[str, ...] | None = None  # where its chat links grant: None, anywhere

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

    def reads_links_to(self, topic: str) -> bool:
        """May a chat linked to this principal's account grant ``topic`` (maybe a pattern)?
        Only where its issuer could read it itself."""
        return self.link_topics is None or any(covers(p, topic) for p in self.link_topics)

    def may_mint_for(self, sub: str) -> bool:
        """The admin for anyone, an API key for the subs its patterns match, an access token
        for its own account."""
        if self.is_admin:
            return True
        if self.kind == "apikey":
            return any(topic_matches(p, sub) for p in self.subs)
        return self.kind == "token" and sub == self.id

    def minted_from(self) -> tuple[str, ...]:
        """What a token minted by this principal derives from: revoking any of it ends
        that token (the admin can't be revoked: nothing)."""
        if self.is_admin:
            return ()
        if self.kind == "apikey":
            return (f"key:{self.id}",)
        return (*self.issued_by, f"sub:{self.id}", *((f"jti:{self.jti}",) if self.jti else ()))

    def minted_link_topics(self) -> tuple[str, ...] | None:
        """Where the chat links of a token minted by this principal grant: what the issuer
        reads itself (a key: its topic patterns; a token: its own bound, same account)."""
        if self.is_admin:
            return None
        return self.topics if self.kind == "apikey" else self.link_topics

    def may_read(self, topic: str) -> bool:
        """A topic its patterns match; and its own items' progress (``pipeline:<owner>``)
        whatever its patterns, as it reads its own documents."""
        return self.is_admin or any(topic_matches(p, topic) for p in self.topics) or (
            topic == progress_topic(self.owner))

    def reads_all(self, requested: str) -> bool:
        """May it read every topic ``requested`` (a name or a pattern) names?"""
        return self.is_admin or any(covers(p, requested) for p in self.topics)


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
