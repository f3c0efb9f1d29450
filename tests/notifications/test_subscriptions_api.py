"""``/v1/subscriptions``: created with the secret shown once, starting at the topic's end
(or after ``after``); listed, read, paused, resumed, replayed and deleted by their owner
only; topic patterns covered by the credential's topics; ``GET /v1/admin/subscriptions``
with each one's lag."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jwt
import pytest

from gateway.access import apikeys
from gateway.config import Secret
from gateway.stores.runtime import Runtime
from gateway.web.app import create_app

HOOK = {"type": "webhook", "url": "https://93.184.216.34/in"}  # public, no lookup
# The API alone: nothing is delivered to that address from here.
API_ONLY = {"notifications": {"deliver": False}}


@pytest.fixture
async def client(runtime: Runtime, make_client: Any) -> Any:
    return await make_client(api_only(runtime))


def api_only(runtime: Runtime, **notifications: Any) -> Any:
    settings = dataclasses.replace(runtime.settings, sections={
        "notifications": {"deliver": False, **notifications}})
    return create_app(dataclasses.replace(runtime, settings=settings))
SCOPE = frozenset({"subscriptions:write"})
JWT_SECRET = "subscriptions-test-secret-0123456789abcdef"


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


async def publish(client: Any, topic: str, n: int) -> None:
    for _ in range(n):
        assert (await client.post(f"/v1/topics/{topic}/events", json={})).status == 202


async def create(client: Any, body: dict[str, Any],
                 headers: dict[str, str] | None = None) -> tuple[int, Any]:
    response = await client.post("/v1/subscriptions", json=body, headers=headers)
    return response.status, await response.json()


async def test_create_shows_the_secret_once_and_starts_at_the_end(client: Any) -> None:
    await publish(client, "deploys", 2)
    status, made = await create(client, {"topic": "deploys", "destination": HOOK})
    assert status == 201
    assert made["secret"].startswith("whsec_") and made["state"] == "active"
    assert made["cursor"] == {"deploys": 2} and made["destination"] == HOOK
    read = await (await client.get(f"/v1/subscriptions/{made['id']}")).json()
    assert "secret" not in read and read["cursor"] == {"deploys": 2}
    listed = await (await client.get("/v1/subscriptions")).json()
    assert [s["id"] for s in listed["subscriptions"]] == [made["id"]]
    assert all("secret" not in s for s in listed["subscriptions"])
    # "after" starts it earlier; a given secret is kept; a prefix starts every topic it
    # covers at its end.
    given = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"
    status, early = await create(client, {"topic": "deploys", "after": 0,
                                          "destination": {**HOOK, "secret": given}})
    assert (status, early["cursor"], early["secret"]) == (201, {"deploys": 0}, given)
    await publish(client, "alerts:db", 3)
    await publish(client, "alerts:web", 1)
    status, prefix = await create(client, {"topic": "alerts:*", "kinds": ["event"],
                                           "destination": HOOK})
    assert (status, prefix["cursor"], prefix["kinds"]) == (
        201, {"alerts:db": 3, "alerts:web": 1}, ["event"])


async def test_owners_see_and_change_only_their_own(client: Any, runtime: Runtime) -> None:
    alice = await apikeys.create(runtime.pg, "a", SCOPE, ("alerts:*",))
    bob = await apikeys.create(runtime.pg, "b", SCOPE, ("alerts:*",))
    status, mine = await create(client, {"topic": "alerts:db", "destination": HOOK},
                                bearer(alice["key"]))
    assert status == 201
    path = f"/v1/subscriptions/{mine['id']}"
    as_bob = bearer(bob["key"])
    assert (await client.get(path, headers=as_bob)).status == 404
    assert (await client.delete(path, headers=as_bob)).status == 404
    assert (await client.post(path + "/pause", headers=as_bob)).status == 404
    assert (await client.post(path + "/replay", json={"after": 0}, headers=as_bob)).status \
        == 404
    assert (await client.get(path + "/failures", headers=as_bob)).status == 404
    assert (await (await client.get("/v1/subscriptions", headers=as_bob)).json()) == {
        "subscriptions": []}
    # The owner and the admin see it.
    assert (await client.get(path, headers=bearer(alice["key"]))).status == 200
    admin_list = await (await client.get("/v1/subscriptions")).json()
    assert [s["id"] for s in admin_list["subscriptions"]] == [mine["id"]]
    assert (await client.delete(path, headers=as_bob)).status == 404
    assert (await client.delete(path, headers=bearer(alice["key"]))).status == 200
    assert (await client.get(path)).status == 404


async def test_topic_patterns_must_be_covered(client: Any, runtime: Runtime) -> None:
    key = bearer((await apikeys.create(runtime.pg, "k", SCOPE, ("alerts:*", "ci")))["key"])
    for topic in ("alerts:db", "alerts:*", "alerts:db:*", "ci"):
        assert (await create(client, {"topic": topic, "destination": HOOK}, key))[0] == 201
    for topic in ("*", "alert*", "ci:*", "cid", "pipeline"):
        status, answer = await create(client, {"topic": topic, "destination": HOOK}, key)
        assert (status, answer["error"]) == (403, "forbidden"), topic
    reader = bearer((await apikeys.create(runtime.pg, "r", frozenset({"feed:read"}),
                                          ("*",)))["key"])
    status, answer = await create(client, {"topic": "ci", "destination": HOOK}, reader)
    assert status == 403 and "subscriptions:write" in answer["detail"]
    # Chat destinations come from the chat itself (or the admin).
    status, _ = await create(client, {"topic": "ci", "destination": {
        "type": "telegram", "chat_id": 42}}, key)
    assert status == 403
    assert (await create(client, {"topic": "ci", "destination": {
        "type": "telegram", "chat_id": 42}}))[0] == 201


async def test_an_accounts_tokens_share_its_subscriptions(
        runtime: Runtime, make_client: Any) -> None:
    settings = dataclasses.replace(runtime.settings, jwt_secret=Secret(JWT_SECRET),
                                   sections=API_ONLY)
    client = await make_client(create_app(dataclasses.replace(runtime, settings=settings)))

    def token(sub: str) -> dict[str, str]:
        now = time.time()
        return bearer(jwt.encode({"sub": sub, "iat": now, "exp": now + 300,
                                  "scope": "subscriptions:write", "topics": ["t"]},
                                 JWT_SECRET, algorithm="HS256"))

    status, made = await create(client, {"topic": "t", "destination": HOOK}, token("carol"))
    assert status == 201
    other_token = token("carol")
    assert (await client.get(f"/v1/subscriptions/{made['id']}", headers=other_token)).status \
        == 200
    assert (await client.get(f"/v1/subscriptions/{made['id']}", headers=token("dave"))
            ).status == 404


async def test_pause_resume_replay_and_failures(client: Any) -> None:
    await publish(client, "t", 5)
    _, made = await create(client, {"topic": "t", "destination": HOOK})
    path = f"/v1/subscriptions/{made['id']}"
    paused = await (await client.post(path + "/pause")).json()
    assert paused["state"] == "paused"
    resumed = await (await client.post(path + "/resume")).json()
    assert resumed["state"] == "active"
    replayed = await (await client.post(path + "/replay", json={"after": 2})).json()
    assert replayed["cursor"] == {"t": 2}
    # A replay never moves a cursor forward.
    assert (await (await client.post(path + "/replay", json={"after": 4})).json())[
        "cursor"] == {"t": 2}
    for bad in ({}, {"after": -1}, {"after": "3"}, [], {"after": True}):
        assert (await client.post(path + "/replay", json=bad)).status == 400
    assert await (await client.get(path + "/failures")).json() == {"failures": []}


async def test_admin_listing_shows_the_lag(client: Any, runtime: Runtime) -> None:
    await publish(client, "t", 2)
    _, exact = await create(client, {"topic": "t", "destination": HOOK})
    _, early = await create(client, {"topic": "t", "after": 0, "destination": HOOK})
    _, prefix = await create(client, {"topic": "x:*", "destination": HOOK})
    await publish(client, "t", 3)
    await publish(client, "x:a", 4)
    answer = await (await client.get("/v1/admin/subscriptions")).json()
    lags = {s["id"]: (s["lag"], s["state"]) for s in answer["subscriptions"]}
    assert lags == {exact["id"]: (3, "active"), early["id"]: (5, "active"),
                    prefix["id"]: (4, "active")}
    key = bearer((await apikeys.create(runtime.pg, "k", SCOPE, ("*",)))["key"])
    assert (await client.get("/v1/admin/subscriptions", headers=key)).status == 403


async def test_bad_requests_are_refused(client: Any, runtime: Runtime,
                                        make_client: Any) -> None:
    for body in ([], {"destination": HOOK}, {"topic": "", "destination": HOOK},
                 {"topic": "bad topic", "destination": HOOK},
                 {"topic": "t", "destination": {"type": "fax"}},
                 {"topic": "t", "destination": {"type": "webhook", "url": "ftp://x/"}},
                 {"topic": "t", "destination": {"type": "webhook", "url": "http://x.com/"}},
                 {"topic": "t", "destination": {"type": "webhook", "url": "https://u:p@x/"}},
                 {"topic": "t", "destination": {**HOOK, "secret": "nope"}},
                 {"topic": "t", "destination": {**HOOK, "extra": 1}},
                 {"topic": "t", "destination": HOOK, "template": "{text}"},
                 {"topic": "t", "destination": {"type": "slack", "channel": "C1"},
                  "template": "{data}"},
                 {"topic": "t", "destination": {"type": "slack", "channel": "C1"},
                  "template": "{payload}"},
                 {"topic": "t", "destination": {"type": "slack", "channel": "bad id!"}},
                 {"topic": "t", "destination": HOOK, "kinds": []},
                 {"topic": "t", "destination": HOOK, "after": -1},
                 {"topic": "t", "destination": HOOK, "surprise": 1}):
        status, answer = await create(client, body)
        assert status == 400, (body, answer)
    assert await runtime.pg.fetchval("SELECT count(*) FROM subscriptions") == 0
    # With [notifications] allow_http, plain http is taken; past the per-credential limit, 409.
    relaxed = await make_client(api_only(runtime, allow_http=True,
                                         max_subscriptions_per_credential=2))
    plain = {"topic": "t", "destination": {"type": "webhook", "url": "http://93.184.216.34/"}}
    assert (await create(relaxed, plain))[0] == 201
    key = bearer((await apikeys.create(runtime.pg, "k", SCOPE, ("t",)))["key"])
    assert [(await create(relaxed, plain, key))[0] for _ in range(3)] == [201, 201, 409]
