"""The credential check behind every route with a scope (``gateway.api.routes`` calls it):
``Authorization: Bearer <credential>`` (or ``?access_token=`` where the route allows it),
then the admin token (never from the URL), an API key, or an access token; the scope the
route needs; a 401 counted against the client address (past the limit: 429 for a while,
the admin token included), a 403 naming what is missing. Credentials never reach a log or an
error body."""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Protocol

from aiohttp import web

from gateway.access import apikeys
from gateway.access.principal import ADMIN, Principal
from gateway.access.revocation import Revocations
from gateway.access.tokens import InvalidToken, TokenVerifier
from gateway.api.errors import ApiError
from gateway.api.state import (
    AUTHENTICATE,
    REFUSE,
    STILL_VALID,
    Authenticate,
    Refuse,
    StillValid,
)
from gateway.stores.runtime import Runtime

CHALLENGE = {"WWW-Authenticate": 'Bearer error="invalid_token"'}


class Barrier(Protocol):
    """The brute-force barrier (``gateway.security.brute``), as this check uses it."""

    def client_ip(self, request: web.Request) -> str: ...
    async def check(self, ip: str) -> None: ...
    async def record_failure(self, ip: str) -> int: ...
    def refusal(self, seconds: int) -> ApiError: ...


def _digest(value: str) -> bytes:
    # aiohttp hands header bytes that are not UTF-8 over as surrogates: hash the bytes sent.
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def bearer(request: web.Request, query_token: bool) -> tuple[str | None, bool]:
    """The credential, and whether it came in the URL (``?access_token=``)."""
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and presented.strip():
        return presented.strip(), False
    if query_token:
        return request.query.get("access_token") or None, True
    return None, False


class Authenticator:
    """One per application; the auth routes use its verifier and revocations too, so a
    process has one key set, one token cache and one revocation cache."""

    def __init__(self, runtime: Runtime, barrier: Barrier | None = None) -> None:
        settings = runtime.settings
        self.runtime = runtime
        self.admin = _digest(settings.admin_token.get()) if settings.admin_token else None
        self.tokens = TokenVerifier(settings)
        self.revocations = Revocations(runtime.durable)
        self.api_keys = apikeys.ApiKeys(runtime.pg_reads, self.revocations.auto)
        self.barrier = barrier

    async def __call__(self, request: web.Request, scope: str, query_token: bool,
                       checks_revocation: bool = False) -> Principal:
        ip = self.barrier.client_ip(request) if self.barrier else ""
        if self.barrier:
            await self.barrier.check(ip)  # a blocked address gets 429, whatever it presents
        credential, in_url = bearer(request, query_token)
        if credential is None:
            raise await self._refuse(ip, "missing bearer credential")
        principal, reason = await self._identify(credential, checks_revocation)
        if principal is not None and in_url and principal.is_admin:
            # A URL ends up in proxy and browser logs: the admin token never travels there.
            principal, reason = None, ("the admin token is refused in ?access_token=; send it "
                                       "as Authorization: Bearer")
        if principal is None:
            raise await self._refuse(ip, reason)
        if not principal.allows(scope):
            raise ApiError(403, "forbidden", f"the credential lacks the scope {scope}")
        return principal

    async def _identify(self, credential: str,
                        checks_revocation: bool) -> tuple[Principal | None, str]:
        if self.admin is not None and hmac.compare_digest(_digest(credential), self.admin):
            return ADMIN, ""
        if apikeys.looks_like_key(credential):
            found = await self.api_keys.verify(credential, check_mark=not checks_revocation)
            return found, "unknown or revoked API key"
        if not self.tokens.enabled:
            return None, "unknown credential"
        try:
            principal = await self.tokens.verify(credential)
        except InvalidToken as exc:
            return None, str(exc)
        if await self.revocations.revoked(principal, principal.issued_at):
            return None, "token revoked"
        return principal, ""

    async def still_valid(self, principal: object) -> bool:
        """For an open stream: not expired and not revoked since it was authenticated (an
        access token's ``bl:jti:``/``bl:sub:``, an API key's ``bl:key:``, each read at most
        once a second per process)."""
        if not isinstance(principal, Principal) or principal.is_admin:
            return True
        if principal.kind == "apikey":
            return not await self.api_keys.revoked_lately(principal.id)
        if principal.expires_at is not None and time.time() >= principal.expires_at:
            return False
        return not await self.revocations.revoked(principal, principal.issued_at)

    async def refuse(self, request: web.Request, reason: str) -> Exception:
        """The 401 for a credential the route itself found revoked, counted like any."""
        return await self._refuse(self.barrier.client_ip(request) if self.barrier else "",
                                  reason)

    async def _refuse(self, ip: str, reason: str) -> ApiError:
        error = ApiError(401, "unauthorized", reason, CHALLENGE)
        if self.barrier is None:
            return error
        blocked_for = await self.barrier.record_failure(ip)
        return self.barrier.refusal(blocked_for) if blocked_for else error


def install(app: web.Application, runtime: Runtime, barrier: Barrier | None = None) -> None:
    """Let every scoped route of ``app`` check credentials."""
    authenticator = Authenticator(runtime, barrier)
    app[AUTHENTICATOR] = authenticator
    check: Authenticate = authenticator
    still_valid: StillValid = authenticator.still_valid
    app[AUTHENTICATE] = check
    app[STILL_VALID] = still_valid
    refuse: Refuse = authenticator.refuse
    app[REFUSE] = refuse


AUTHENTICATOR: web.AppKey[Authenticator] = web.AppKey("authenticator", Authenticator)
