"""``/v1/auth/token``, ``/refresh`` (rotation, the 10 s grace, reuse revokes the family),
``/revoke`` and ``/v1/admin/revoke``; an open stream ends when its token expires or is
revoked."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import jwt
import pytest
from aiohttp.test_utils import TestClient

from gateway import keys
from gateway.access import apikeys
from gateway.access.refresh import token_hash
from gateway.access.tokens import mint
from gateway.config import Secret, Settings
from gateway.push.web import HUB
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app
from tests.conftest import TEST_ADMIN_TOKEN
from tests.helpers import registry_violations, wait_until

SECRET = "auth-test-secret-0123456789-0123456789"
ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def client(runtime: Runtime, settings: Settings,
                 make_client: Callable[..., Any]) -> AsyncIterator[TestClient[Any, Any]]:
    rt = await open_runtime(dataclasses.replace(settings, jwt_secret=Secret(SECRET)))
    try:
        yield await make_client(create_app(rt), rt=rt)
    finally:
        await rt.close()


async def issue(client: TestClient[Any, Any], headers: dict[str, str] = ADMIN,
                **body: Any) -> tuple[int, Any]:
    payload = {"sub": "alice", "scope": "feed:read", "topics": ["conversation:1"], **body}
    async with client.post("/v1/auth/token", json=payload, headers=headers) as response:
        return response.status, await response.json()


async def feed_status(client: TestClient[Any, Any], access: str,
                      topic: str = "conversation:1") -> int:
    async with client.get(f"/v1/feed?topic={topic}", headers=bearer(access)) as response:
        return response.status


async def refresh(client: TestClient[Any, Any], token: str) -> tuple[int, Any]:
    async with client.post("/v1/auth/refresh", json={"refresh_token": token},
                           headers={"Authorization": ""}) as response:
        return response.status, await response.json()


async def test_issue_and_never_wider_than_the_issuer(client: TestClient[Any, Any]) -> None:
    status, pair = await issue(client)
    assert status == 200 and pair["token_type"] == "Bearer" and pair["expires_in"] == 900
    assert await feed_status(client, pair["access_token"]) == 200
    assert await feed_status(client, pair["access_token"], "conversation:2") == 403
    status, issuer = await issue(client, scope="tokens:issue feed:read",
                                 topics=["conversation:*"])
    assert status == 200
    status, wider = await issue(client, bearer(issuer["access_token"]), topics=["pipeline"])
    assert status == 403 and "pipeline" in wider["detail"]
    status, wider = await issue(client, bearer(issuer["access_token"]), scope="admin")
    assert status == 403 and "admin" in wider["detail"]
    status, _ = await issue(client, bearer(issuer["access_token"]), topics=["conversation:7"])
    assert status == 200
    status, _ = await issue(client, bearer(pair["access_token"]))
    assert status == 403  # no tokens:issue


async def test_refresh_rotates_grace_then_reuse_revokes_the_family(
        client: TestClient[Any, Any], runtime: Runtime) -> None:
    _, first = await issue(client)
    status, second = await refresh(client, first["refresh_token"])
    assert status == 200 and second["refresh_token"] != first["refresh_token"]
    assert await feed_status(client, second["access_token"]) == 200
    again_status, again = await refresh(client, first["refresh_token"])  # within the grace
    assert again_status == 200 and again == second
    grace = keys.refresh_grace(token_hash(first["refresh_token"]).hex())
    assert 0 < await runtime.durable.ttl(grace) <= 10
    assert await registry_violations(runtime.durable, "durable") == []
    await runtime.durable.delete(grace)  # as 10 s later
    assert await feed_status(client, second["access_token"]) == 200  # read and cached
    status, refused = await refresh(client, first["refresh_token"])
    assert status == 401 and "family" in refused["detail"]
    status, _ = await refresh(client, second["refresh_token"])
    assert status == 401  # the thief's copy and the owner's are both dead now
    # So are the access tokens the family issued, from the next request (bl:fam:).
    assert await feed_status(client, second["access_token"]) == 401
    assert await feed_status(client, first["access_token"]) == 401
    assert await registry_violations(runtime.durable, "durable") == []


async def test_two_concurrent_refreshes_both_succeed(client: TestClient[Any, Any]) -> None:
    _, first = await issue(client)
    (a_status, a), (b_status, b) = await asyncio.gather(
        refresh(client, first["refresh_token"]), refresh(client, first["refresh_token"]))
    assert (a_status, b_status) == (200, 200) and a == b


async def test_revoke_an_access_token_and_an_account(client: TestClient[Any, Any]) -> None:
    _, pair = await issue(client)
    assert await feed_status(client, pair["access_token"]) == 200  # read and cached here
    async with client.post("/v1/auth/revoke", json={"token": pair["access_token"]},
                           headers={"Authorization": ""}) as revoked:
        assert revoked.status == 200 and (await revoked.json()) == {}
    assert await feed_status(client, pair["access_token"]) == 401  # the next request
    _, later = await issue(client, sub="bob")
    _, other = await issue(client, sub="carol")
    assert await feed_status(client, later["access_token"]) == 200
    async with client.post("/v1/admin/revoke", json={"sub": "bob"}) as by_admin:
        assert by_admin.status == 200
    assert await feed_status(client, later["access_token"]) == 401
    assert await feed_status(client, other["access_token"]) == 200
    status, _ = await refresh(client, later["refresh_token"])
    assert status == 401  # bob's refresh families ended too
    for presented in ("garbage", "grt_unknown", pair["access_token"]):  # unknown, or again
        async with client.post("/v1/auth/revoke", json={"token": presented},
                               headers={"Authorization": ""}) as same:
            assert same.status == 200 and (await same.json()) == {}  # RFC 7009: no tell


async def test_a_revocation_reaches_another_replica_within_a_second(
        client: TestClient[Any, Any], settings: Settings,
        make_client: Callable[..., Any]) -> None:
    """Replica B has read the token's marks (cached 1 s) when replica A revokes it, by jti
    and by sub: A refuses it from the next request, B within the 1 s the README states."""
    rt = await open_runtime(dataclasses.replace(settings, jwt_secret=Secret(SECRET)))
    try:
        other = await make_client(create_app(rt), rt=rt)
        _, by_holder = await issue(client, sub="dora")
        _, by_admin = await issue(client, sub="erin")
        for token, path, body in (
                (by_holder["access_token"], "/v1/auth/revoke",
                 {"token": by_holder["access_token"]}),
                (by_admin["access_token"], "/v1/admin/revoke", {"sub": "erin"})):
            assert await feed_status(other, token) == 200  # B holds the marks it read
            async with client.post(path, json=body) as revoked:
                assert revoked.status == 200
            revoked_at = time.monotonic()
            assert await feed_status(client, token) == 401
            await wait_until(lambda t=token: _status_is(other, t, 401), timeout=3,  # type: ignore[misc]
                             message="refused on the other replica")
            assert time.monotonic() - revoked_at <= 1.2, path
    finally:
        await rt.close()


async def test_a_login_right_after_log_out_everywhere_works(
        client: TestClient[Any, Any], runtime: Runtime) -> None:
    """The not-before mark and iat are compared exactly: a token minted after the revocation
    in the same second is valid (it was refused for its whole life when iat was whole
    seconds); those minted before are refused."""
    for attempt in range(5):  # until the re-login falls in the revocation's second
        sub = f"alice-{attempt}"
        _, old = await issue(client, sub=sub)
        assert await feed_status(client, old["access_token"]) == 200
        async with client.post("/v1/admin/revoke", json={"sub": sub}) as revoked:
            assert revoked.status == 200
        status, new = await issue(client, sub=sub)  # /v1/auth/token at once
        assert status == 200
        mark = float(await runtime.durable.get(keys.revoked_before(sub)))
        iat = jwt.decode(new["access_token"], options={"verify_signature": False})["iat"]
        assert iat >= mark
        if int(iat) == int(mark):
            break
    else:
        raise AssertionError("no re-login in the revocation's second in five tries")
    assert await feed_status(client, new["access_token"]) == 200
    status, again = await refresh(client, new["refresh_token"])
    assert status == 200 and await feed_status(client, again["access_token"]) == 200
    local = mint(SECRET, sub, frozenset({"feed:read"}), ("conversation:1",))  # gateway token
    assert await feed_status(client, local) == 200
    await wait_until(lambda: _status_is(client, old["access_token"], 401), timeout=3,
                     message="the token from before the revocation refused")
    # Whole-second iat (an identity provider's, no jti): the revocation's second is refused
    # with the tokens before it, the next one passes; each judged by its own iat although
    # they share one cache entry.
    def foreign(iat: int) -> str:
        return jwt.encode({"sub": sub, "iat": iat, "exp": iat + 300, "scope": "feed:read",
                           "topics": ["conversation:1"]}, SECRET, algorithm="HS256")

    assert await feed_status(client, foreign(int(mark) + 1)) == 200
    assert await feed_status(client, foreign(int(mark))) == 401


async def test_revocation_marks_outlive_the_longest_token_accepted(
        runtime: Runtime, settings: Settings, make_client: Callable[..., Any]) -> None:
    """``bl:jti:`` from the admin (no exp known) and ``bl:sub:`` live as long as the longest
    token the gateway accepts: [access] max_token_seconds (+5 s leeway), which it also
    enforces on what it issues and verifies."""
    rt = await open_runtime(dataclasses.replace(
        settings, jwt_secret=Secret(SECRET), sections={"access": {"max_token_seconds": 600}}))
    try:
        client = await make_client(create_app(rt), rt=rt)
        async with client.post("/v1/admin/revoke", json={"jti": "abc123"}) as by_jti:
            assert by_jti.status == 200
        assert 600 + 5 - 2 <= await runtime.durable.ttl(keys.revoked_jti("abc123")) <= 606
        async with client.post("/v1/admin/revoke", json={"sub": "zed"}) as by_sub:
            assert by_sub.status == 200
        assert 600 + 5 - 2 <= await runtime.durable.ttl(keys.revoked_before("zed")) <= 606
        status, refused = await issue(client, ttl=601)
        assert status == 400 and "1-600" in refused["detail"]
        status, _ = await issue(client, ttl=600)
        assert status == 200
        now = int(time.time())
        too_long = jwt.encode({"sub": "x", "iat": now, "exp": now + 700, "scope": "feed:read",
                               "topics": ["conversation:1"]}, SECRET, algorithm="HS256")
        assert await feed_status(client, too_long) == 401  # would outlive a bl:jti: mark
        assert await registry_violations(runtime.durable, "durable") == []
    finally:
        await rt.close()


async def _status_is(client: TestClient[Any, Any], access: str, status: int) -> bool:
    return await feed_status(client, access) == status


async def _disconnect_reason(client: TestClient[Any, Any], access: str) -> str:
    async with client.get("/v1/stream?topics=conversation:1", headers=bearer(access)) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: ") and b'"reason"' in line:
                return str(json.loads(line[6:])["reason"])
    raise AssertionError("the stream ended without gateway.disconnect")


async def test_a_stream_ends_when_its_token_expires(client: TestClient[Any, Any]) -> None:
    _, short = await issue(client, ttl=2)
    async with asyncio.timeout(10):
        assert await _disconnect_reason(client, short["access_token"]) == "token_expired"


async def test_a_stream_ends_when_its_token_is_revoked(client: TestClient[Any, Any]) -> None:
    _, pair = await issue(client)
    reading = asyncio.create_task(_disconnect_reason(client, pair["access_token"]))
    hub = client.server.app[HUB]  # type: ignore[union-attr]
    await wait_until(lambda: hub.subscriber_count == 1, timeout=5, message="stream open")
    async with client.post("/v1/auth/revoke", json={"token": pair["access_token"]},
                           headers={"Authorization": ""}) as revoked:
        assert revoked.status == 200
    async with asyncio.timeout(6):  # 2 s watch + 1 s cache, within the 5 s promised
        assert await reading == "revoked"


async def test_a_stream_ends_when_its_api_key_is_revoked(client: TestClient[Any, Any],
                                                          runtime: Runtime) -> None:
    created = await apikeys.create(runtime.pg, "reader", frozenset({"feed:read"}),
                                   ("conversation:1",))
    reading = asyncio.create_task(_disconnect_reason(client, created["key"]))
    hub = client.server.app[HUB]  # type: ignore[union-attr]
    await wait_until(lambda: hub.subscriber_count == 1, timeout=5, message="stream open")
    assert await apikeys.revoke(runtime.pg, runtime.durable, created["id"])
    started = time.monotonic()
    async with asyncio.timeout(6):
        assert await reading == "revoked"
    assert time.monotonic() - started <= 5  # the bound promised: 2 s watch + 1 s cache
    await wait_until(lambda: hub.subscriber_count == 0, timeout=5, message="unsubscribed")


async def test_push_client_refreshes_and_resumes_across_expiry(
        client: TestClient[Any, Any], runtime: Runtime) -> None:
    """Tokens of 2 s, rows for 5 s: the stream is ended at each expiry, the client asks its
    credential function again and resumes from its cursor: every row once, in order."""
    import time

    from gateway.push import feed
    from gateway.push.client import PushClient

    issued: list[tuple[str, float]] = []

    async def credential() -> str:
        if not issued or issued[-1][1] - time.time() < 0.5:
            _, pair = await issue(client, ttl=2)
            issued.append((pair["access_token"], time.time() + 2))
        return issued[-1][0]

    base = str(client.make_url("")).rstrip("/")
    offsets: list[int] = []
    async with PushClient(base, ["conversation:1"], since={"conversation:1": 0},
                          credential=credential, poll_seconds=0.5) as push:
        async def follow() -> None:
            async for row in push:
                offsets.append(row.offset)

        following = asyncio.create_task(follow())
        for n in range(25):
            await feed.append_and_publish(runtime.pg, runtime.cache, "conversation:1",
                                          "message", {"n": n})
            await asyncio.sleep(0.2)  # a producer's pace (5 s in all), not a synchronisation
        await wait_until(lambda: len(offsets) >= 25, timeout=10, message="every row")
        following.cancel()
    assert offsets == list(range(1, 26))
    assert len(issued) >= 2 and push.connects >= 2  # it did go through an expiry


async def test_the_auth_routes_refuse_missing_and_insufficient_credentials(
        client: TestClient[Any, Any]) -> None:
    anonymous = {"Authorization": ""}
    for method, path in (("POST", "/v1/auth/token"), ("POST", "/v1/admin/revoke"),
                         ("POST", "/v1/auth/link-code"), ("GET", "/v1/auth/links"),
                         ("DELETE", "/v1/auth/links/1")):
        async with client.request(method, path, json={}, headers=anonymous) as response:
            assert response.status == 401, path
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
    _, pair = await issue(client)  # feed:read only
    async with client.post("/v1/admin/revoke", json={"sub": "bob"},
                           headers=bearer(pair["access_token"])) as not_admin:
        assert not_admin.status == 403 and "admin" in (await not_admin.json())["detail"]
    async with client.post("/v1/auth/refresh", json={"refresh_token": "grt_forged"},
                           headers=anonymous) as forged:
        assert forged.status == 401


async def test_maintenance_refuses_issuing_refreshing_and_link_codes(
        client: TestClient[Any, Any], runtime: Runtime) -> None:
    """A restore would lose what these write: 503 + Retry-After while maintenance is on,
    nothing written; revoking still works; all of it again once maintenance ends."""
    from gateway.leases import maintenance

    _, pair = await issue(client)
    families = await runtime.pg.fetchval("SELECT count(*) FROM refresh_tokens")
    await maintenance.switch_on(runtime.durable, "restore", seconds=120)

    async def refused() -> bool:  # a probe that writes nothing either way (400 before)
        async with client.post("/v1/auth/token", json={"sub": "m", "scope": "x"}) as response:
            return response.status == 503
    await wait_until(refused, timeout=3, message="maintenance seen")  # its refresh interval
    answers = []
    for method, path, body, headers in (
            ("POST", "/v1/auth/token", {"sub": "alice"}, ADMIN),
            ("POST", "/v1/auth/refresh", {"refresh_token": pair["refresh_token"]},
             {"Authorization": ""}),
            ("POST", "/v1/auth/link-code", {}, bearer(pair["access_token"]))):
        async with client.request(method, path, json=body, headers=headers) as response:
            answers.append((response.status, (await response.json())["error"],
                            int(response.headers["Retry-After"]) > 0))
    assert answers == [(503, "maintenance", True)] * 3
    assert await runtime.pg.fetchval("SELECT count(*) FROM refresh_tokens") == families
    assert await runtime.pg.fetchval("SELECT count(*) FROM link_codes") == 0
    await maintenance.switch_off(runtime.durable)

    async def issued() -> bool:
        return (await issue(client))[0] == 200
    await wait_until(issued, timeout=3, message="maintenance over")
    assert (await refresh(client, pair["refresh_token"]))[0] == 200


async def test_the_admin_token_is_refused_in_the_url(client: TestClient[Any, Any],
                                                     runtime: Runtime) -> None:
    """``?access_token=`` ends up in proxy logs: the admin token is a counted 401 there (a
    client token still streams with it; the header still works for the admin)."""
    from gateway.security.brute import fail_key

    anonymous = {"Authorization": ""}
    async with client.get(f"/v1/stream?topics=conversation:1&access_token={TEST_ADMIN_TOKEN}",
                          headers=anonymous) as refused:
        assert refused.status == 401
        assert "Authorization" in (await refused.json())["detail"]
    assert int(await runtime.durable.get(fail_key("127.0.0.1")) or 0) == 1
    _, pair = await issue(client)
    async with client.get("/v1/stream?topics=conversation:1&access_token="
                          + pair["access_token"], headers=anonymous) as streamed:
        assert streamed.status == 200
    async with client.get("/v1/stream?topics=conversation:1", headers=ADMIN) as header:
        assert header.status == 200
