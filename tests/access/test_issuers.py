"""``tokens:issue`` is no wider than its holder (issue 24 point 2): an issuer mints only for
the accounts it may (an API key's ``--subs`` patterns, a token's own sub), the chat links of
the account it minted for grant only what the issuer could read itself, and revoking the
issuer (``gateway apikey revoke``, its jti, its sub) ends what it minted: the access tokens
and the refresh families. Real gateway apps on the session's Redis and PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

from aiohttp.test_utils import TestClient

from gateway.access import apikeys
from gateway.conversations import links
from gateway.stores.runtime import Runtime
from tests.access import test_links
from tests.access.test_links import say
from tests.conftest import ServerSet
from tests.helpers import gateway_cli, registry_violations, wait_until

ANONYMOUS = {"Authorization": ""}
# The chat-link tests' app: a runtime with a JWT secret and the fast conversation limits.
rt = test_links.rt
client = test_links.client


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


async def mint(client: TestClient[Any, Any], issuer: dict[str, str], sub: str,
               scope: str = "feed:read", topics: tuple[str, ...] = ()) -> tuple[int, Any]:
    async with client.post("/v1/auth/token", headers=issuer,
                           json={"sub": sub, "scope": scope, "topics": list(topics)}) as resp:
        return resp.status, await resp.json()


async def status(client: TestClient[Any, Any], method: str, path: str,
                 credential: str) -> int:
    async with client.request(method, path, headers=bearer(credential)) as response:
        return response.status


async def refresh(client: TestClient[Any, Any], token: str) -> int:
    async with client.post("/v1/auth/refresh", json={"refresh_token": token},
                           headers=ANONYMOUS) as response:
        return response.status


async def key(rt: Runtime, topics: tuple[str, ...], subs: tuple[str, ...]) -> str:
    created = await apikeys.create(rt.pg, "issuer", frozenset({"tokens:issue", "feed:read"}),
                                   topics, subs)
    return str(created["key"])


async def test_a_key_mints_only_for_its_subs_and_links_grant_only_what_it_reads(
        rt: Runtime, client: TestClient[Any, Any]) -> None:
    """Alice has a linked chat. A key limited to the topic `pipeline` could mint a token for
    her and read the chat, list and delete her links and ask link codes for her: now it
    mints only for the subs its patterns allow, and a token it minted for Alice gets no
    link grant beyond the key's own topics. A key that reads conversation:* itself passes
    the grant on; Alice's own token (the admin's) keeps all of it."""
    _, alice = await mint(client, {}, "alice")  # the admin's client header: any sub
    alice_token = alice["access_token"]
    async with client.post("/v1/auth/link-code", headers=bearer(alice_token)) as issued:
        code = (await issued.json())["code"]
    await say(rt, "4242", "hello", "1")
    assert await say(rt, "4242", f"/link {code}", "2") == [links.LINKED]
    conversation = await rt.pg.fetchval("SELECT id FROM conversations WHERE chat = '4242'")
    link_id = await rt.pg.fetchval("SELECT id FROM chat_links WHERE sub = 'alice'")
    chat = f"/v1/feed?topic=conversation:{conversation}"

    no_subs = bearer(await key(rt, ("pipeline",), ()))
    assert (await mint(client, no_subs, "alice"))[0] == 403
    apps_only = bearer(await key(rt, ("pipeline",), ("app-*",)))
    refused, detail = await mint(client, apps_only, "alice")
    assert refused == 403 and "sub" in detail["detail"]
    assert (await mint(client, apps_only, "app-1", topics=("pipeline",)))[0] == 200

    narrow = bearer(await key(rt, ("pipeline",), ("alice",)))
    ok, minted = await mint(client, narrow, "alice", topics=("pipeline",))
    assert ok == 200
    token = minted["access_token"]
    assert await status(client, "GET", chat, token) == 403
    assert await status(client, "GET", "/v1/auth/links", token) == 403
    assert await status(client, "POST", "/v1/auth/link-code", token) == 403
    assert await status(client, "DELETE", f"/v1/auth/links/{link_id}", token) == 403
    assert await rt.pg.fetchval("SELECT count(*) FROM chat_links") == 1
    assert await rt.pg.fetchval("SELECT count(*) FROM link_codes WHERE used_at IS NULL") == 0

    reader = bearer(await key(rt, ("conversation:*",), ("alice",)))
    ok, passed = await mint(client, reader, "alice")
    assert ok == 200, passed
    assert await status(client, "GET", chat, passed["access_token"]) == 200
    assert await status(client, "GET", "/v1/auth/links", passed["access_token"]) == 200
    assert await status(client, "GET", chat, alice_token) == 200

    # An access token with tokens:issue mints for its own account only.
    _, own = await mint(client, {}, "bob", scope="tokens:issue feed:read")
    assert (await mint(client, bearer(own["access_token"]), "alice"))[0] == 403
    assert (await mint(client, bearer(own["access_token"]), "bob"))[0] == 200


async def test_revoking_the_issuer_ends_what_it_minted(
        rt: Runtime, client: TestClient[Any, Any], servers: ServerSet) -> None:
    """A key, an issuing token's jti, an issuing account: each revoked, the access tokens
    minted through it are refused (at once on the replica that took it; within 1 s of the
    CLI's key revocation) and its refresh families (30 days) are ended."""
    issuer_key = await key(rt, ("news",), ("app-*",))
    key_id = issuer_key.split("_")[1]
    _, by_key = await mint(client, bearer(issuer_key), "app-1", topics=("news",))
    assert await status(client, "GET", "/v1/feed?topic=news", by_key["access_token"]) == 200
    code, _, _ = await gateway_cli(servers, "apikey", "revoke", key_id)
    assert code == 0
    revoked_at = time.monotonic()
    await wait_until(lambda: _refused(client, by_key["access_token"]), timeout=3,
                     message="a token the revoked key minted refused")
    assert time.monotonic() - revoked_at <= 1.2
    assert await refresh(client, by_key["refresh_token"]) == 401

    for revocation in ("jti", "sub"):
        sub = f"svc-{revocation}"
        _, issuer = await mint(client, {}, sub, scope="tokens:issue feed:read",
                               topics=("news",))
        _, minted = await mint(client, bearer(issuer["access_token"]), sub, topics=("news",))
        _, refreshed = await mint(client, bearer(issuer["access_token"]), sub,
                                  topics=("news",))
        assert await refresh(client, refreshed["refresh_token"]) == 200  # a family in use
        assert await status(client, "GET", "/v1/feed?topic=news", minted["access_token"]) == 200
        if revocation == "jti":  # the holder revokes its issuing token
            async with client.post("/v1/auth/revoke", headers=ANONYMOUS,
                                   json={"token": issuer["access_token"]}) as done:
                assert done.status == 200
        else:
            async with client.post("/v1/admin/revoke", json={"sub": sub}) as done:
                assert done.status == 200
        assert await _refused(client, minted["access_token"])  # the next request
        assert await refresh(client, minted["refresh_token"]) == 401
        families = await rt.pg.fetchval(
            "SELECT count(*) FROM refresh_tokens WHERE $1 = ANY(issued_by)"
            " AND revoked_at IS NULL", f"{revocation}:" + (
                sub if revocation == "sub" else _jti(issuer["access_token"])))
        assert families == 0
    assert await registry_violations(rt.durable, "durable") == []


def _jti(token: str) -> str:
    import jwt
    return str(jwt.decode(token, options={"verify_signature": False})["jti"])


async def _refused(client: TestClient[Any, Any], token: str) -> bool:
    return await status(client, "GET", "/v1/feed?topic=news", token) == 401
