"""``POST /v1/topics/{topic}/events``: an event becomes a feed row; ``event_id`` makes a repeat
(even a concurrent one) a duplicate with the first one's offset within the dedup window;
the scope, the credential's topics and the gateway's own topics decide who may publish."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from gateway.access import apikeys
from gateway.stores.runtime import Runtime
from gateway.web.app import create_app

JSON = {"Content-Type": "application/json"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **JSON}


async def publish(client: Any, topic: str, body: Any, headers: dict[str, str] | None = None
                  ) -> tuple[int, Any]:
    response = await client.post(f"/v1/topics/{topic}/events", data=json.dumps(body),
                                 headers=headers or JSON)
    return response.status, await response.json()


async def test_an_event_is_a_feed_row_every_reader_sees(client: Any) -> None:
    status, answer = await publish(client, "deploys", {
        "kind": "deploy.done", "text": "v1.2 is live", "data": {"env": "prod"}})
    assert (status, answer) == (202, {"status": "accepted", "topic": "deploys", "offset": 1})
    status, answer = await publish(client, "deploys", {})
    assert (status, answer["offset"]) == (202, 2)
    page = await (await client.get("/v1/feed?topic=deploys")).json()
    assert [(r["offset"], r["kind"], r["payload"]) for r in page["rows"]] == [
        (1, "deploy.done", {"text": "v1.2 is live", "data": {"env": "prod"}}),
        (2, "event", {})]


async def test_the_same_event_id_is_a_duplicate_with_the_first_offset(
        client: Any, runtime: Runtime) -> None:
    first = {"text": "build 7 green", "event_id": "build-7"}
    assert await publish(client, "ci", {"text": "warm-up"}) == (
        202, {"status": "accepted", "topic": "ci", "offset": 1})
    assert await publish(client, "ci", first) == (
        202, {"status": "accepted", "topic": "ci", "offset": 2})
    # A repeat, even with another text, is the same event: nothing appended.
    assert await publish(client, "ci", {"text": "other", "event_id": "build-7"}) == (
        200, {"status": "duplicate", "topic": "ci", "offset": 2})
    # The id is per topic.
    assert (await publish(client, "ci2", first))[0] == 202
    page = await (await client.get("/v1/feed?topic=ci")).json()
    assert [r["payload"] for r in page["rows"]] == [
        {"text": "warm-up"}, {"text": "build 7 green", "event_id": "build-7"}]
    # Past the dedup window (GATEWAY_DEDUP_TTL, 24 h) the id is a new event.
    await runtime.pg.execute(
        "UPDATE feed_events SET created_at = now() - interval '86401 seconds'"
        " WHERE topic = 'ci'")
    assert await publish(client, "ci", first) == (
        202, {"status": "accepted", "topic": "ci", "offset": 3})


async def test_concurrent_repeats_make_one_row(client: Any, runtime: Runtime) -> None:
    answers = await asyncio.gather(*(
        publish(client, "race", {"text": f"try {n}", "event_id": "once"}) for n in range(20)))
    assert sorted(status for status, _ in answers) == [200] * 19 + [202]
    assert {body["offset"] for _, body in answers} == {1}
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed WHERE topic = 'race'") == 1


@pytest.mark.parametrize("topic", ["pipeline", "conversation:7", "webhook:demo", "docs:k.1",
                                   "pipeline:k.1"])
async def test_the_gateways_own_topics_are_refused_even_to_the_admin(
        client: Any, runtime: Runtime, topic: str) -> None:
    status, answer = await publish(client, topic, {"text": "forged"})
    assert (status, answer["error"]) == (403, "forbidden")
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed") == 0


async def test_scope_and_topics_of_the_credential(client: Any, runtime: Runtime) -> None:
    writer = await apikeys.create(runtime.pg, "w", frozenset({"events:write"}), ("alerts:*",))
    reader = await apikeys.create(runtime.pg, "r", frozenset({"feed:read"}), ("alerts:*",))
    assert (await publish(client, "alerts:db", {"text": "x"}, bearer(writer["key"])))[0] == 202
    status, answer = await publish(client, "other", {"text": "x"}, bearer(writer["key"]))
    assert (status, answer["error"]) == (403, "forbidden") and "other" in answer["detail"]
    status, answer = await publish(client, "alerts:db", {"text": "x"}, bearer(reader["key"]))
    assert status == 403 and "events:write" in answer["detail"]
    status, _ = await publish(client, "alerts:db", {"text": "x"}, {"Authorization": "", **JSON})
    assert status == 401
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed") == 1


async def test_bad_events_are_refused_with_a_4xx(client: Any, runtime: Runtime) -> None:
    big = {"text": "x" * (64 * 1024)}
    status, answer = await publish(client, "t", big)
    assert (status, answer["error"]) == (413, "payload_too_large")
    at_limit = 64 * 1024 - len(json.dumps({"text": ""}))
    assert (await publish(client, "t", {"text": "y" * at_limit}))[0] == 202
    for body in ([], {"kind": ""}, {"kind": "a\nb"}, {"text": 5}, {"data": [1]},
                 {"event_id": "has space"}, {"event_id": "x" * 201}, {"extra": 1},
                 {"text": "nul \u0000"}):
        status, answer = await publish(client, "t", body)
        assert status == 400, (body, answer)
    response = await client.post("/v1/topics/t/events", data=b"{not json", headers=JSON)
    assert response.status == 400
    response = await client.post("/v1/topics/t/events", data=b"{}",
                                 headers={"Content-Type": "text/plain"})
    assert response.status == 415
    status, _ = await publish(client, "bad topic!", {})
    assert status in (400, 404)
    assert await runtime.pg.fetchval("SELECT count(*) FROM feed") == 1


async def test_publishing_is_limited_per_credential(
        runtime: Runtime, make_client: Any) -> None:
    settings = dataclasses.replace(runtime.settings,
                                   sections={"notifications": {"events_per_minute": 3}})
    client = await make_client(create_app(dataclasses.replace(runtime, settings=settings)))
    key = await apikeys.create(runtime.pg, "w", frozenset({"events:write"}), ("t",))
    statuses = [(await publish(client, "t", {}, bearer(key["key"])))[0] for _ in range(4)]
    assert statuses == [202, 202, 202, 429]
    # The admin token is not limited.
    assert [(await publish(client, "t", {}))[0] for _ in range(4)] == [202] * 4
