"""Access tokens (JWT) with PyJWT: HS256 with ``GATEWAY_JWT_SECRET``, and RS256/ES256/EdDSA
with the keys of ``GATEWAY_JWT_JWKS_URL`` (PyJWT's ``PyJWKClient`` caches them and refetches
when a token names an unknown ``kid``). ``exp`` is required, ``iss``/``aud`` are checked when
configured, and only those algorithms are accepted (``alg: none`` never is)."""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from typing import Any

import jwt

from gateway.access.bounded import Bounded
from gateway.access.principal import (
    MAX_ISSUERS,
    Principal,
    known_scopes,
    parse_scopes,
    parse_topics,
)
from gateway.config import Settings

ASYMMETRIC = ["RS256", "ES256", "EdDSA"]
DEFAULT_TTL = 900
# The longest an access token the gateway accepts may still have to live (``exp`` - now),
# ``[access] max_token_seconds``: what it issues and what it verifies, so a ``bl:jti:`` mark
# written with no ``exp`` known (``POST /v1/admin/revoke``) outlives any token it names.
MAX_TOKEN_SECONDS = 86400
LEEWAY_SECONDS = 5
JWKS_COOLDOWN_SECONDS = 10.0
VERIFIED_ENTRIES = 10_000


class InvalidToken(Exception):
    """Why a presented token is refused (the message goes into the 401; never the token)."""


def max_token_seconds(settings: Settings) -> int:
    value = int(settings.section("access").get("max_token_seconds", MAX_TOKEN_SECONDS))
    if value < 1:
        raise ValueError("[access] max_token_seconds must be at least 1")
    return value


def longest_life(settings: Settings) -> int:
    """How long any token the gateway accepts can still live: a ``bl:`` mark kept this long
    outlives it."""
    return max_token_seconds(settings) + LEEWAY_SECONDS


class TokenVerifier:
    def __init__(self, settings: Settings) -> None:
        self.secret = settings.jwt_secret.get() if settings.jwt_secret else None
        self.issuer = settings.jwt_issuer
        self.audience = settings.jwt_audience
        self.max_seconds = max_token_seconds(settings)
        # An unknown kid refetches the key set, at most once per cooldown: random kids must
        # not turn every forged token into a request to the identity provider.
        cooldown = float(settings.section("access").get("jwks_cooldown_seconds",
                                                        JWKS_COOLDOWN_SECONDS))
        self.jwks = (jwt.PyJWKClient(settings.jwt_jwks_url, cache_keys=True, lifespan=300,
                                     timeout=10, cooldown_duration=cooldown)
                     if settings.jwt_jwks_url else None)
        self._verified: Bounded[str, Principal] = Bounded(VERIFIED_ENTRIES)

    @property
    def enabled(self) -> bool:
        return bool(self.secret or self.jwks)

    async def verify(self, token: str) -> Principal:
        """The token's principal; a token verified before comes from a bounded cache until
        it expires (a signature cannot change: ~60 µs of PyJWT saved per request)."""
        cached = self._verified.get(token)
        if cached is not None and cached.expires_at is not None and cached.expires_at > time.time():
            return cached
        principal = await self._verify(token)
        self._verified.put(token, principal)
        return principal

    async def _verify(self, token: str) -> Principal:
        if not token.isascii():  # a JWT is ASCII; bytes that are not UTF-8 arrive as surrogates
            raise InvalidToken("not a JWT")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("not a JWT") from None
        alg = header.get("alg")
        if alg == "HS256" and self.secret:
            key: Any = self.secret
        elif alg in ASYMMETRIC and self.jwks is not None:
            try:  # blocking HTTP on a cache miss: off the event loop
                key = (await asyncio.to_thread(self.jwks.get_signing_key_from_jwt, token)).key
            except jwt.PyJWTError as exc:
                raise InvalidToken(f"signing key not found: {type(exc).__name__}") from None
        else:
            raise InvalidToken(f"algorithm {str(alg)[:20]!r} is not accepted")
        try:
            claims = jwt.decode(token, key, algorithms=[alg], issuer=self.issuer,
                                audience=self.audience, leeway=LEEWAY_SECONDS,
                                options={"require": ["exp", "sub"],
                                         "verify_aud": self.audience is not None})
        except jwt.ExpiredSignatureError:
            raise InvalidToken("token expired") from None
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"invalid token: {type(exc).__name__}") from None
        if float(claims["exp"]) - time.time() > self.max_seconds + LEEWAY_SECONDS:
            raise InvalidToken(f"token lives longer than the {self.max_seconds} s accepted")
        return principal_from_claims(claims)


def principal_from_claims(claims: dict[str, Any]) -> Principal:
    """Unknown scopes are ignored (they grant nothing); malformed claims refuse the token."""
    scope = claims.get("scope")
    if scope is not None and not isinstance(scope, str):
        raise InvalidToken("scope must be a space-separated string")
    scopes = known_scopes(scope or "")
    topics = claims.get("topics") or []
    if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
        raise InvalidToken("topics must be a list of strings")
    issued = claims.get("iat")
    links = claims.get("links")
    return Principal("token", str(claims["sub"]), scopes, tuple(topics),
                     jti=str(claims["jti"]) if claims.get("jti") else None,
                     expires_at=float(claims["exp"]),
                     issued_at=float(issued) if isinstance(issued, int | float) else None,
                     issued_by=_strings(claims.get("by") or [], "by", MAX_ISSUERS),
                     link_topics=None if links is None else _strings(links, "links", 1000))


def _strings(value: Any, name: str, most: int) -> tuple[str, ...]:
    if (not isinstance(value, list) or len(value) > most
            or not all(isinstance(v, str) for v in value)):
        raise InvalidToken(f"{name} must be a list of at most {most} strings")
    return tuple(value)


def mint(secret: str, sub: str, scopes: frozenset[str], topics: tuple[str, ...] = (),
         ttl: int = DEFAULT_TTL, *, issuer: str | None = None,
         audience: str | None = None, issued_by: tuple[str, ...] = (),
         link_topics: tuple[str, ...] | None = None) -> str:
    """An HS256 access token (``gateway token``, ``gateway dev``, ``/v1/auth/...``).

    ``iat`` has sub-second precision (a NumericDate may be fractional) and is compared
    exactly with an account's not-before mark (``bl:sub:``), so a token minted in the same
    second as, but after, a "log out everywhere" is valid. ``issued_by`` (claim ``by``) and
    ``link_topics`` (claim ``links``): see ``gateway.access.principal``."""
    now = time.time()
    claims: dict[str, Any] = {"sub": sub, "iat": now, "exp": int(now) + ttl,
                              "jti": secrets.token_hex(12), "scope": " ".join(sorted(scopes)),
                              "topics": list(topics)}
    if issued_by:
        claims["by"] = list(issued_by)
    if link_topics is not None:
        claims["links"] = list(link_topics)
    if issuer:
        claims["iss"] = issuer
    if audience:
        claims["aud"] = audience
    return jwt.encode(claims, secret, algorithm="HS256")


def main_token(args: argparse.Namespace, settings: Settings) -> int:
    """``gateway token --sub S [--scope ...] [--topics ...] [--ttl N]``: mint locally."""
    if not settings.jwt_secret:
        print("gateway token: GATEWAY_JWT_SECRET is required", file=sys.stderr)
        return 2
    try:
        scopes = parse_scopes(args.scope)
        longest = max_token_seconds(settings)
    except ValueError as exc:
        print(f"gateway token: {exc}", file=sys.stderr)
        return 2
    if not 1 <= args.ttl <= longest:
        print(f"gateway token: --ttl must be 1-{longest} seconds ([access] max_token_seconds)",
              file=sys.stderr)
        return 2
    print(mint(settings.jwt_secret.get(), args.sub, scopes, parse_topics(args.topics),
               args.ttl, issuer=settings.jwt_issuer, audience=settings.jwt_audience))
    return 0
