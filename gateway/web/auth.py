"""``/v1/auth/...``: issuing and ending access tokens.

While maintenance mode is on, issuing, refreshing and link codes answer 503 + ``Retry-After``
(a restore would lose what they wrote); revocations still go through.

- ``POST /v1/auth/token`` (``tokens:issue``): ``{"sub", "scope"?, "topics"?, "ttl"?}`` → an
  access token and the first refresh token of a new family; never wider than the issuer.
- ``POST /v1/auth/refresh`` ``{"refresh_token"}`` → the next pair (the token is the
  credential; refusals count in the address's brute-force barrier).
- ``POST /v1/auth/revoke`` ``{"token"}``: the holder ends an access token (``bl:``) or a
  refresh token's family; answered ``200 {}`` whatever the token (RFC 7009: unknown,
  expired, already revoked or revoked now look the same), so it reveals nothing about it.
- ``POST /v1/admin/revoke`` (``admin``): ``{"jti"}`` (``bl:jti:`` kept for the longest life
  an accepted token can have: ``[access] max_token_seconds`` + the 5 s leeway) or ``{"sub"}``
  (the account's refresh families, then a not-before mark: every token issued until now).
- ``POST /v1/auth/link-code``, ``GET /v1/auth/links``, ``DELETE /v1/auth/links/{id}``: an
  access token's account (``[access] link_codes_per_hour`` codes, 20) links chats
  (``gateway.conversations.links``) and then reads their ``conversation:<id>`` topics
  (``gateway.access.grants``: a removed link ends the streams that read through it).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from gateway.access import issuers
from gateway.access.authenticate import AUTHENTICATOR
from gateway.access.grants import LinkGrants
from gateway.access.principal import Principal as AccessPrincipal
from gateway.access.principal import parse_scopes
from gateway.access.refresh import PREFIX as REFRESH_PREFIX
from gateway.access.refresh import Grant, Issuer, Refused
from gateway.access.tokens import DEFAULT_TTL, InvalidToken, longest_life, max_token_seconds
from gateway.api import routes
from gateway.api.errors import ApiError
from gateway.api.spec import Answer, Operation, Param, array, integer, obj, one_of, string
from gateway.api.state import PUBLIC, TOPIC_GRANT, Principal, principal_of
from gateway.conversations import links
from gateway.inbound.http_intake import install as install_inbound
from gateway.inbound.http_intake import read_body, refuse_during_maintenance
from gateway.keys import owner_namespace
from gateway.ratelimit import Limiter
from gateway.ratelimit.credential import CredentialRate
from gateway.stores.runtime import Runtime

CHALLENGE = {"WWW-Authenticate": 'Bearer error="invalid_token"'}
LINK_CODES_PER_HOUR = 20  # [access] link_codes_per_hour: codes one account may ask for


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await read_body(request) or b"{}")
    except ValueError:
        raise ApiError(400, "bad_request", "body must be JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "body must be a JSON object")
    return body


def _text(body: dict[str, Any], name: str, *, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise ApiError(400, "bad_request", f"{name} must be a non-empty string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # an unpaired surrogate escape (\ud800-\udfff)
        raise ApiError(400, "bad_request", f"{name} must be valid Unicode text") from None
    return value


class AuthRoutes:
    def __init__(self, app: web.Application, runtime: Runtime) -> None:
        settings = runtime.settings
        self.runtime = runtime
        authenticator = app[AUTHENTICATOR]  # create_app installs it before the components
        self.verifier = authenticator.tokens
        self.revocations = authenticator.revocations
        inbound = install_inbound(app, runtime)
        self.barrier = inbound.barrier
        self.maintenance = inbound.maintenance  # a restore must not lose what is issued now
        self.max_ttl = max_token_seconds(settings)
        # bl: marks whose token's exp is unknown live this long: past any accepted token.
        self.longest = longest_life(settings)
        self.issuer = (Issuer(runtime.pg, runtime.durable, settings.jwt_secret.get(),
                              issuer=settings.jwt_issuer, audience=settings.jwt_audience,
                              max_ttl=self.max_ttl)
                       if settings.jwt_secret else None)

    def _issuing(self) -> Issuer:
        if self.issuer is None:
            raise ApiError(503, "not_configured",
                           "issuing tokens needs GATEWAY_JWT_SECRET on the gateway")
        return self.issuer

    async def token(self, request: web.Request) -> web.Response:
        issuer, principal = self._issuing(), principal_of(request)
        await refuse_during_maintenance(self.maintenance)
        body = await _body(request)
        sub = _text(body, "sub")
        assert sub is not None
        try:
            scopes = parse_scopes(str(body.get("scope") or "feed:read"))
        except ValueError as exc:
            raise ApiError(400, "bad_request", str(exc)) from None
        topics = body.get("topics") or []
        if not isinstance(topics, list) or not all(isinstance(t, str) and t for t in topics):
            raise ApiError(400, "bad_request", "topics must be a list of topic patterns")
        ttl = body.get("ttl", DEFAULT_TTL)
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= self.max_ttl:
            raise ApiError(400, "bad_request", f"ttl must be 1-{self.max_ttl} seconds")
        assert isinstance(principal, AccessPrincipal)  # the access room authenticated it
        refused = issuers.refusal(principal, sub, scopes, tuple(topics))
        if refused:
            raise ApiError(403, "forbidden", refused)
        grant = Grant(sub, scopes, tuple(topics), ttl, principal.minted_from(),
                      principal.minted_link_topics())

        async def issuer_valid() -> bool:
            return not await self.revocations.revoked_now(principal)

        try:
            pair = await issuer.login(grant, issuer_valid)
        except Refused as exc:
            raise ApiError(401, "unauthorized", str(exc), CHALLENGE) from None
        return web.json_response(pair)

    async def refresh(self, request: web.Request) -> web.Response:
        issuer = self._issuing()
        ip = self.barrier.client_ip(request)
        await self.barrier.check(ip)
        presented = _text(await _body(request), "refresh_token")
        assert presented is not None
        await refuse_during_maintenance(self.maintenance)
        try:
            return web.json_response(await issuer.refresh(presented))
        except Refused as exc:
            if exc.stolen:  # theft: the family's access tokens end with it
                await self.revocations.revoke("fam", exc.stolen, self.longest)
            blocked_for = await self.barrier.record_failure(ip)
            if blocked_for:
                raise self.barrier.refusal(blocked_for) from None
            raise ApiError(401, "unauthorized", str(exc), CHALLENGE) from None

    async def revoke(self, request: web.Request) -> web.Response:
        presented = _text(await _body(request), "token")
        assert presented is not None
        if presented.startswith(REFRESH_PREFIX):
            await self._issuing().revoke_token(presented)
        elif self.verifier.enabled:
            try:
                principal = await self.verifier.verify(presented)
            except InvalidToken:
                principal = None
            if principal is not None and principal.jti:
                await self._revoke_jti(principal.jti, None if principal.allows(
                    "tokens:issue") else principal.expires_at)
        return web.json_response({})  # the same answer whatever the token was

    async def _revoke_jti(self, jti: str, expires_at: float | None) -> None:
        """The token (its mark kept until it expires; when that is unknown, or when it
        may have minted tokens that live longer, as long as any accepted token can), then
        the refresh families it minted."""
        await self.revocations.revoke_jti(jti, expires_at, self.longest)
        await issuers.end_families_of(self.runtime.pg, f"jti:{jti}")

    async def admin_revoke(self, request: web.Request) -> web.Response:
        body = await _body(request)
        jti, sub = _text(body, "jti", required=False), _text(body, "sub", required=False)
        if (jti is None) == (sub is None):
            raise ApiError(400, "bad_request", "give exactly one of jti and sub")
        if jti is not None:
            await self._revoke_jti(jti, None)
            return web.json_response({"revoked": {"jti": jti}})
        assert sub is not None
        # The mark first: a login by one of the account's issuing tokens, under way now,
        # either sees it (refused) or holds its issuer lock, which the families' end waits
        # for. Then the families; then the mark again, later than every access token a
        # refresh under way minted.
        await self.revocations.revoke_sub(sub, self.longest)
        if self.issuer is not None:
            await self.issuer.revoke_sub(sub)
        await self.revocations.revoke_sub(sub, self.longest)
        return web.json_response({"revoked": {"sub": sub}})


TEXT = string(minLength=1, maxLength=4096)
PAIR = Answer("an access token and its refresh token", obj({
    "access_token": string("a JWT"), "token_type": one_of("Bearer"),
    "expires_in": integer("seconds the access token lives", minimum=1),
    "refresh_token": string("grt_...: single use, it gives the next pair")}))
NOT_CONFIGURED = "issuing tokens needs GATEWAY_JWT_SECRET (not_configured)"
MAINTENANCE = "maintenance mode is on (maintenance; with Retry-After)"
TOKEN = Operation(
    "Issue an access token and a refresh token for an account the issuer may mint for "
    "(admin: any; API key: its subs patterns; access token: its own), never wider than it",
    {200: PAIR},
    errors={400: "sub is missing, or scope, topics or ttl is bad",
            401: "the issuing credential was revoked meanwhile",
            403: "a sub the issuer may not mint for, or wider than the issuing credential",
            503: f"{NOT_CONFIGURED}, or {MAINTENANCE}"},
    body=obj({"sub": string("the account", minLength=1, maxLength=4096)}, {
        "scope": string("space-separated scopes", default="feed:read"),
        "topics": array(string(minLength=1), "topic names or prefixes ending in *"),
        "ttl": integer("the access token's life in seconds, at most [access] "
                       "max_token_seconds", minimum=1, default=DEFAULT_TTL)}, more=True),
    tag="auth")
REFRESH = Operation(
    "The next pair for a refresh token (which is spent)",
    {200: PAIR},
    errors={400: "refresh_token is missing or not valid text",
            401: "unknown, spent or revoked refresh token (counted by the address's "
                 "barrier; a spent one also ends its login and its access tokens)",
            429: "this address sent too many refused tokens: blocked for a cool-down",
            503: f"{NOT_CONFIGURED}, or {MAINTENANCE}"},
    body=obj({"refresh_token": TEXT}, more=True), signed=("the refresh token in the body",),
    tag="auth")
REVOKE = Operation(
    "End an access token, or a refresh token and its whole login (RFC 7009)",
    {200: Answer("the same answer whatever the token was", obj())},
    errors={400: "token is missing or not valid text", 503: NOT_CONFIGURED},
    body=obj({"token": TEXT}, more=True), signed=("the token in the body",), tag="auth")
ADMIN_REVOKE = Operation(
    "Revoke one access token (jti) or every token of an account (sub)",
    {200: Answer("what was revoked", obj({"revoked": obj(optional={
        "jti": string(), "sub": string()})}))},
    errors={400: "not exactly one of jti and sub"},
    body={**obj(optional={"jti": TEXT, "sub": TEXT}, more=True),
          "oneOf": [{"required": ["jti"]}, {"required": ["sub"]}]}, tag="admin")
NO_ACCOUNT = ("the credential has no account (use an access token with a sub), or its "
              "issuer could not read the account's conversations")
LINK_CODE = Operation(
    "A code to link a chat to this account (send /link <code> to the bot)",
    {200: Answer("the code", obj({"code": string(pattern="^[0-9]{8}$"),
                                  "expires_in": integer(minimum=1)}))},
    errors={403: NO_ACCOUNT,
            429: "this account asked for more than [access] link_codes_per_hour codes",
            503: f"no free link code now (busy), or {MAINTENANCE}"}, tag="auth")
LINK = obj({"id": integer(minimum=1), "platform": string(), "chat": string(),
            "created_at": string(format="date-time")})
LINKS = Operation("This account's chat links",
                  {200: Answer("the links", obj({"links": array(LINK)}))},
                  errors={403: NO_ACCOUNT}, tag="auth")
UNLINK = Operation(
    "Remove a chat link (streams reading through it end)",
    {200: Answer("removed", obj({"deleted": integer()}))},
    errors={403: NO_ACCOUNT, 404: "no such link of this account"},
    params=(Param("id", string(pattern="^[0-9]{1,18}$"), "the link's id", where="path",
                  required=True),),
    tag="auth")


def _account(request: web.Request) -> str:
    """The account whose chat links the caller manages: a token's, if its issuer could
    read every conversation itself (a token an API key minted without ``conversation:*``
    manages none)."""
    principal = principal_of(request)
    account = principal.account
    if account is None:
        raise ApiError(403, "forbidden", "chat links belong to an account: use an access "
                       "token with a sub")
    if not principal.reads_links_to("conversation:*"):
        raise ApiError(403, "forbidden", "this token's issuer could not read the account's "
                       "conversations: it cannot manage its chat links")
    return account


def setup(app: web.Application, runtime: Runtime) -> None:
    auth = AuthRoutes(app, runtime)
    grants = LinkGrants(runtime.pg, runtime.durable, auth.revocations.auto)

    async def grant(principal: Principal, topics: list[str]) -> set[str]:
        return await grants.grant(principal, topics)

    per_hour = int(runtime.settings.section("access").get("link_codes_per_hour",
                                                          LINK_CODES_PER_HOUR))
    code_rate = CredentialRate(Limiter(runtime.durable, auth.revocations.auto), "link-codes",
                               per_hour, 3600, "link codes an hour for this account")

    async def link_code(request: web.Request) -> web.Response:
        account = _account(request)
        await refuse_during_maintenance(auth.maintenance)
        await code_rate.admit(owner_namespace(account))
        principal = principal_of(request)  # its topics: what the chat may subscribe to
        topics = principal.topics if isinstance(principal, AccessPrincipal) else ()
        try:
            return web.json_response(await links.new_code(runtime.pg, account, topics))
        except links.NoFreeCode:
            raise ApiError(503, "busy", "no free link code now; retry",
                           {"Retry-After": "1"}) from None

    async def list_links(request: web.Request) -> web.Response:
        found = await links.links_of(runtime.pg, _account(request))
        return web.json_response({"links": [link.to_json() for link in found]})

    async def delete_link(request: web.Request) -> web.Response:
        raw = request.match_info["id"]
        if not raw.isdigit() or len(raw) > 18:
            raise ApiError(404, "not_found", "no such link")
        if not await grants.unlink(_account(request), int(raw)):
            raise ApiError(404, "not_found", "no such link of this account")
        return web.json_response({"deleted": int(raw)})

    app[TOPIC_GRANT] = grant
    routes.post(app, "/v1/auth/link-code", link_code, scope="feed:read", doc=LINK_CODE)
    routes.get(app, "/v1/auth/links", list_links, scope="feed:read", doc=LINKS)
    routes.add(app, "DELETE", "/v1/auth/links/{id}", delete_link, scope="feed:read",
               doc=UNLINK)
    routes.post(app, "/v1/auth/token", auth.token, scope="tokens:issue", doc=TOKEN)
    # The token in the body is the credential of these two (refresh: the one presented;
    # revoke: the one being revoked).
    routes.post(app, "/v1/auth/refresh", auth.refresh, scope=PUBLIC, doc=REFRESH)
    routes.post(app, "/v1/auth/revoke", auth.revoke, scope=PUBLIC, doc=REVOKE)
    routes.post(app, "/v1/admin/revoke", auth.admin_revoke, scope="admin", doc=ADMIN_REVOKE)
