"""Credentials on every route, against the real stores: the admin token, API keys (CLI,
hash only, revoked on every replica at once), access tokens (HS256 and a JWKS with key
rotation), scopes and topics, job ownership and the critical-priority grant."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway import keys
from gateway.access.tokens import mint
from gateway.config import Secret, Settings
from gateway.pipeline.stages import meta_key
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app
from tests.conftest import ServerSet
from tests.helpers import gateway_cli

SECRET = "test-jwt-secret-of-enough-length-0123456789"
ANONYMOUS = {"Authorization": ""}
CLOSED_ROUTES = [("GET", "/v1/search?q=x"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs/x"),
                 ("GET", "/v1/feed?topic=pipeline"), ("GET", "/v1/stream?topics=pipeline"),
                 ("GET", "/metrics"), ("GET", "/v1/dashboard/summary"),
                 ("GET", "/v1/admin/queues")]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def token(scope: str, topics: list[str] | None = None, **claims: Any) -> str:
    now = int(time.time())
    body = {"sub": "alice", "exp": now + 300, "iat": now, "scope": scope,
            "topics": topics or [], **claims}
    return jwt.encode({k: v for k, v in body.items() if v is not None}, SECRET,
                      algorithm="HS256")


async def pipeline_items(runtime: Runtime) -> int:
    return int(await runtime.durable.hlen(meta_key()))


@pytest.fixture
async def apps(runtime: Runtime, settings: Settings,
               make_client: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """``await apps(**settings changes)`` → a client on a full app of its own runtime."""
    runtimes: list[Runtime] = []

    async def start(**changes: Any) -> TestClient[Any, Any]:
        rt = await open_runtime(dataclasses.replace(settings, **changes))
        runtimes.append(rt)
        client: TestClient[Any, Any] = await make_client(create_app(rt), rt=rt)
        return client

    yield start
    for rt in runtimes:
        await rt.close()


async def test_every_closed_route_refuses_no_credential(client: TestClient[Any, Any]) -> None:
    for method, path in CLOSED_ROUTES[:7]:  # 7 refusals stay under the barrier's limit
        async with client.request(method, path, headers=ANONYMOUS) as response:
            assert response.status == 401, path
            assert response.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'
            assert (await response.json())["error"] == "unauthorized"
    for path in ("/healthz", "/readyz", "/"):
        async with client.get(path, headers=ANONYMOUS) as response:
            assert response.status in (200, 503), path  # public (readyz may be not ready)


async def test_api_key_lifecycle_and_revocation_on_another_replica(
        servers: ServerSet, apps: Callable[..., Any], runtime: Runtime) -> None:
    code, out, _ = await gateway_cli(servers, "apikey", "create", "--name", "ingest",
                                     "--scopes", "jobs:write,jobs:read")
    assert code == 0
    created = json.loads(out)
    assert set(created) == {"id", "key", "name", "scopes", "topics", "subs"}
    assert created["subs"] == []  # may mint tokens for nobody unless --subs says so
    key = created["key"]
    stored = await runtime.pg.fetchrow("SELECT * FROM api_keys WHERE id = $1", created["id"])
    assert stored is not None and key.encode() not in bytes(stored["key_hash"])
    assert key not in json.dumps({k: str(v) for k, v in dict(stored).items()})
    replica_a, replica_b = await apps(), await apps()
    job = {"job_id": "report-1", "document": {"text": "quarterly numbers"}}
    async with replica_a.post("/v1/jobs", json=job, headers=bearer(key)) as accepted:
        assert accepted.status == 202
        assert (await accepted.json())["item_id"] == f"k.{created['id']}/report-1"
    async with replica_b.get("/v1/search?q=x", headers=bearer(key)) as refused:
        assert refused.status == 403
        assert "search:read" in (await refused.json())["detail"]
    code, out, _ = await gateway_cli(servers, "apikey", "list")
    assert code == 0 and key not in out and created["id"] in out
    code, _, _ = await gateway_cli(servers, "apikey", "revoke", created["id"])
    assert code == 0
    async with replica_b.get("/v1/jobs/report-1", headers=bearer(key)) as revoked:
        assert revoked.status == 401  # the next request on the other replica
    # POST /v1/jobs reads the mark inside its enqueue script: refused too, nothing written,
    # with a job_id (claim + ADD) and without (ADD alone).
    queued = await pipeline_items(runtime)
    for late in ({"job_id": "report-2", "document": {"text": "late"}},
                 {"document": {"text": "late, no id"}}):
        async with replica_b.post("/v1/jobs", json=late, headers=bearer(key)) as refused:
            assert refused.status == 401
            assert refused.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    assert await pipeline_items(runtime) == queued
    assert not await runtime.durable.exists(keys.dedup_job(f"k.{created['id']}/report-2"))
    code, _, err = await gateway_cli(servers, "apikey", "create", "--name", "x",
                                     "--scopes", "jobs:writ")
    assert code == 2 and "unknown scope" in err


async def test_job_ids_belong_to_their_credential(apps: Callable[..., Any]) -> None:
    client = await apps(jwt_secret=Secret(SECRET))
    writer = token("jobs:write jobs:read")
    other = token("jobs:write jobs:read", sub="mallory")
    job = {"job_id": "shared-name", "document": {"text": "alice's"}}
    async with client.post("/v1/jobs", json=job, headers=bearer(writer)) as first:
        assert first.status == 202
        mine = (await first.json())["item_id"]
    squat = {"job_id": "shared-name", "document": {"text": "mallory's"}}
    async with client.post("/v1/jobs", json=squat, headers=bearer(other)) as second:
        assert second.status == 202  # its own job, not a "duplicate" that drops alice's
        theirs = (await second.json())["item_id"]
    assert mine != theirs
    async with client.get("/v1/jobs/shared-name", headers=bearer(writer)) as read:
        assert read.status == 200 and (await read.json())["item_id"] == mine
    async with client.get(f"/v1/jobs/{mine}", headers=bearer(other)) as foreign:
        assert foreign.status == 404
    urgent = {"document": {"text": "now"}, "priority": "critical"}
    async with client.post("/v1/jobs", json=urgent, headers=bearer(writer)) as refused:
        assert refused.status == 403 and "jobs:critical" in (await refused.json())["detail"]
    granted = token("jobs:write jobs:critical")
    async with client.post("/v1/jobs", json=urgent, headers=bearer(granted)) as ok:
        assert ok.status == 202


async def test_topics_by_feed_stream_and_query_token(apps: Callable[..., Any]) -> None:
    client = await apps(jwt_secret=Secret(SECRET))
    reader = token("feed:read", ["conversation:1"])
    async with client.get("/v1/feed?topic=conversation:1", headers=bearer(reader)) as ok:
        assert ok.status == 200
    async with client.get("/v1/feed?topic=conversation:2", headers=bearer(reader)) as other:
        assert other.status == 403 and "conversation:2" in (await other.json())["detail"]
    async with client.get("/v1/stream?topics=conversation:1,conversation:2",
                          headers=bearer(reader)) as mixed:
        assert mixed.status == 403  # refused whole
    async with client.get("/v1/stream?topics=conversation:2",
                          params={"access_token": reader}, headers=ANONYMOUS) as query:
        assert query.status == 403
    async with client.get("/v1/stream?topics=conversation:1",
                          params={"access_token": reader}, headers=ANONYMOUS) as streaming:
        assert streaming.status == 200
    async with client.get("/v1/feed?topic=conversation:1", params={"access_token": reader},
                          headers=ANONYMOUS) as not_here:
        assert not_here.status == 401  # ?access_token= only where EventSource needs it
    wildcard = token("feed:read", ["conversation:*"])
    async with client.get("/v1/feed?topic=conversation:99", headers=bearer(wildcard)) as ok:
        assert ok.status == 200


@pytest.mark.parametrize("case", ["expired", "tampered", "wrong_aud", "alg_none",
                                  "scope_not_a_string", "topics_not_a_list", "no_exp"])
async def test_bad_tokens_are_refused(apps: Callable[..., Any], case: str) -> None:
    client = await apps(jwt_secret=Secret(SECRET), jwt_audience="gateway")
    good = token("feed:read", ["pipeline"], aud="gateway")
    bad = {
        "expired": token("feed:read", ["pipeline"], aud="gateway",
                         exp=int(time.time()) - 60),
        "tampered": good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB"),
        "wrong_aud": token("feed:read", ["pipeline"], aud="someone-else"),
        "alg_none": jwt.encode({"sub": "x", "exp": int(time.time()) + 60, "aud": "gateway",
                                "scope": "feed:read", "topics": ["pipeline"]}, None,
                               algorithm="none"),
        "scope_not_a_string": token(["feed:read"],  # type: ignore[arg-type]
                                    ["pipeline"], aud="gateway"),
        "topics_not_a_list": token("feed:read", aud="gateway", topics="pipeline"),
        "no_exp": token("feed:read", ["pipeline"], aud="gateway", exp=None),
    }[case]
    async with client.get("/v1/feed?topic=pipeline", headers=bearer(good)) as ok:
        assert ok.status == 200
    async with client.get("/v1/feed?topic=pipeline", headers=bearer(bad)) as refused:
        assert refused.status == 401
        assert bad not in await refused.text()


async def test_unknown_scopes_in_a_token_are_ignored(apps: Callable[..., Any]) -> None:
    """An identity provider's token carries scopes of its own: they grant nothing here, and
    do not cost the token the gateway's scopes it also has."""
    client = await apps(jwt_secret=Secret(SECRET))
    idp = token("openid profile feed:read", ["pipeline"])
    async with client.get("/v1/feed?topic=pipeline", headers=bearer(idp)) as ok:
        assert ok.status == 200
    async with client.get("/v1/jobs/x", headers=bearer(idp)) as no_scope:
        assert no_scope.status == 403 and "jobs:read" in (await no_scope.json())["detail"]
    foreign_only = token("openid profile email", ["pipeline"])
    async with client.get("/v1/feed?topic=pipeline", headers=bearer(foreign_only)) as none:
        assert none.status == 403  # authenticated, with no scope of ours


async def test_jwks_keys_and_their_rotation(apps: Callable[..., Any]) -> None:
    keys = {"k1": rsa.generate_private_key(public_exponent=65537, key_size=2048)}

    async def jwks(request: web.Request) -> web.Response:
        return web.json_response({"keys": [
            {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(k.public_key())),
             "kid": kid, "alg": "RS256", "use": "sig"} for kid, k in keys.items()]})

    app = web.Application()
    app.router.add_get("/jwks.json", jwks)
    async with TestServer(app) as provider:
        client = await apps(jwt_jwks_url=str(provider.make_url("/jwks.json")),
                            jwt_issuer="https://idp.test",
                            sections={"access": {"jwks_cooldown_seconds": 0}})

        def signed(kid: str, issuer: str = "https://idp.test") -> str:
            return jwt.encode({"sub": "bob", "exp": int(time.time()) + 300, "iss": issuer,
                               "scope": "feed:read", "topics": ["pipeline"]},
                              keys[kid], algorithm="RS256", headers={"kid": kid})

        async with client.get("/v1/feed?topic=pipeline", headers=bearer(signed("k1"))) as ok:
            assert ok.status == 200
        async with client.get("/v1/feed?topic=pipeline",
                              headers=bearer(signed("k1", "https://evil.test"))) as iss:
            assert iss.status == 401
        keys["k2"] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        # An unknown kid fetches the key set again (at once here: no cooldown configured).
        async with client.get("/v1/feed?topic=pipeline", headers=bearer(signed("k2"))) as new:
            assert new.status == 200
        unknown = jwt.encode({"sub": "bob", "exp": int(time.time()) + 300,
                              "iss": "https://idp.test", "scope": "feed:read",
                              "topics": ["pipeline"]}, keys["k1"], algorithm="RS256",
                             headers={"kid": "not-in-the-set"})
        async with client.get("/v1/feed?topic=pipeline", headers=bearer(unknown)) as kid:
            assert kid.status == 401  # an unknown kid, even after the set is fetched again
        hs = mint(SECRET, "bob", frozenset({"feed:read"}), ("pipeline",))
        async with client.get("/v1/feed?topic=pipeline", headers=bearer(hs)) as hs256:
            assert hs256.status == 401  # no GATEWAY_JWT_SECRET: HS256 is not accepted


async def test_metrics_need_their_scope_unless_public(apps: Callable[..., Any]) -> None:
    closed = await apps(jwt_secret=Secret(SECRET))
    async with closed.get("/metrics", headers=bearer(token("feed:read"))) as refused:
        assert refused.status == 403
    async with closed.get("/metrics", headers=bearer(token("metrics:read"))) as ok:
        assert ok.status == 200
    public = await apps(metrics_public=True)
    async with public.get("/metrics", headers=ANONYMOUS) as open_:
        assert open_.status == 200


async def test_gateway_token_mints_what_the_gateway_accepts(
        servers: ServerSet, apps: Callable[..., Any]) -> None:
    import os
    os.environ["GATEWAY_JWT_SECRET"] = SECRET
    try:
        code, out, _ = await gateway_cli(servers, "token", "--sub", "carol", "--scope",
                                         "feed:read", "--topics", "pipeline", "--ttl", "60")
        too_long, _, err = await gateway_cli(servers, "token", "--sub", "carol",
                                             "--ttl", "86401")  # past max_token_seconds
    finally:
        del os.environ["GATEWAY_JWT_SECRET"]
    assert too_long == 2 and "max_token_seconds" in err
    assert code == 0
    client = await apps(jwt_secret=Secret(SECRET))
    async with client.get("/v1/feed?topic=pipeline", headers=bearer(out.strip())) as ok:
        assert ok.status == 200


async def test_jobs_are_limited_per_credential(apps: Callable[..., Any]) -> None:
    client = await apps(jwt_secret=Secret(SECRET),
                        sections={"access": {"jobs_per_minute": 3}})
    busy, quiet = token("jobs:write"), token("jobs:write", sub="quiet")
    statuses = []
    for n in range(4):
        async with client.post("/v1/jobs", json={"document": {"text": f"job {n}"}},
                               headers=bearer(busy)) as response:
            statuses.append(response.status)
            if response.status == 429:
                assert int(response.headers["Retry-After"]) >= 1
    assert statuses == [202, 202, 202, 429]
    async with client.post("/v1/jobs", json={"document": {"text": "mine"}},
                           headers=bearer(quiet)) as other:
        assert other.status == 202  # another credential is not held up


async def test_cors_for_the_configured_origins_only(apps: Callable[..., Any]) -> None:
    client = await apps(cors_origins=("https://app.example",))
    allowed = {"Origin": "https://app.example", "Access-Control-Request-Method": "GET",
               "Access-Control-Request-Headers": "authorization"}
    async with client.options("/v1/feed", headers=allowed) as preflight:
        assert preflight.status == 204
        assert preflight.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "Authorization" in preflight.headers["Access-Control-Allow-Headers"]
    async with client.get("/v1/feed?topic=pipeline",
                          headers={"Origin": "https://app.example"}) as response:
        assert response.status == 200
        assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"
    async with client.get("/v1/feed?topic=pipeline",
                          headers={"Origin": "https://evil.example"}) as foreign:
        assert "Access-Control-Allow-Origin" not in foreign.headers
    async with client.options("/v1/feed", headers={**allowed,
                                                   "Origin": "https://evil.example"}) as no:
        assert "Access-Control-Allow-Origin" not in no.headers
    async with client.get("/v1/admin/queues",
                          headers={"Origin": "https://app.example"}) as admin:
        assert "Access-Control-Allow-Origin" not in admin.headers  # not a browser route
        assert "Vary" not in admin.headers


async def test_cors_routes_vary_on_origin_whatever_the_origin(
        apps: Callable[..., Any]) -> None:
    """A shared cache must not serve one origin's answer (with or without the CORS headers)
    to another: every answer of a CORS route says it varies on Origin."""
    client = await apps(cors_origins=("https://app.example",))
    for origin in ({"Origin": "https://app.example"}, {"Origin": "https://evil.example"}, {}):
        async with client.get("/v1/feed?topic=pipeline", headers=origin) as response:
            assert response.status == 200
            assert response.headers.getall("Vary") == ["Origin"], origin
        async with client.options("/v1/feed", headers={
                **origin, "Access-Control-Request-Method": "GET"}) as preflight:
            assert preflight.headers.getall("Vary") == ["Origin"], origin
        async with client.post("/v1/auth/revoke", json={"token": "x"},
                               headers={**origin, "Authorization": ""}) as revoke:
            assert "Origin" in revoke.headers.getall("Vary"), origin
