"""GitHub replays on real servers: the same signed body under a fresh ``X-GitHub-Delivery``
is a duplicate for the replay window, and with freshness configured a stale payload is
refused; legitimate new events and redeliveries are unaffected."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway import keys
from gateway.config import ConfigError
from gateway.inbound.replay import DEFAULT_WINDOWS, ReplayPolicy, policies, timestamp_at
from gateway.inbound.webhooks import REPLAY
from gateway.pipeline.status import ready_items
from gateway.stores.runtime import Runtime
from gateway.web.app import create_app
from tests.helpers import registry_violations, request_keys
from tests.inbound.webhook_helpers import body_of, github


async def queued(runtime: Runtime) -> set[str]:
    return set(await ready_items(runtime.durable, "store"))


def push(pushed_at: float | str, after: str = "be42068a") -> bytes:
    return body_of({"ref": "refs/heads/main", "after": after,
                    "repository": {"full_name": "o/r", "pushed_at": pushed_at}})


async def post(client: Any, body: bytes, delivery: str, event: str = "push") -> Any:
    headers = {**github(body, delivery), "X-GitHub-Event": event}
    return await client.post("/v1/webhooks/gh", data=body, headers=headers)


def configured(runtime: Runtime, webhooks: dict[str, Any]) -> Runtime:
    settings = dataclasses.replace(runtime.settings, sections={"webhooks": webhooks})
    return dataclasses.replace(runtime, settings=settings)


async def test_replay_with_fresh_delivery_id_is_a_duplicate(client: Any,
                                                             runtime: Runtime) -> None:
    body = push(int(time.time()))
    assert (await post(client, body, "d-1")).status == 202
    replay = await post(client, body, "d-forged-2")
    assert replay.status == 200
    assert await replay.json() == {"status": "duplicate", "item_id": "webhook:gh:d-1"}
    assert await queued(runtime) == {"webhook:gh:d-1"}
    # No claim was taken for the forged id: it never reached the intake.
    assert await runtime.durable.exists(keys.dedup_webhook("gh", "d-forged-2")) == 0
    marks = [k async for k in runtime.durable.scan_iter("dedup:webhook-body:*")]
    assert len(marks) == 1 and marks[0].startswith("dedup:webhook-body:gh:")
    assert await runtime.durable.get(marks[0]) == "d-1"
    ttl = await runtime.durable.ttl(marks[0])
    assert runtime.settings.dedup_ttl < ttl <= DEFAULT_WINDOWS["github"]
    assert await registry_violations(runtime.durable, "durable") == []


async def test_redelivery_and_new_events_are_unaffected(client: Any, runtime: Runtime) -> None:
    body = push(int(time.time()))
    assert (await post(client, body, "d-1")).status == 202
    again = await post(client, body, "d-1")  # GitHub's redelivery keeps the delivery id
    assert again.status == 200 and (await again.json())["item_id"] == "webhook:gh:d-1"
    other = push(int(time.time()), after="c0ffee00")
    assert (await post(client, other, "d-2")).status == 202
    assert await queued(runtime) == {"webhook:gh:d-1", "webhook:gh:d-2"}


async def test_redelivery_after_a_lost_enqueue_is_taken_in(client: Any,
                                                           runtime: Runtime) -> None:
    """The mark was written but the enqueue failed (store refused, replica died): the
    sender's redelivery, under the same id, is processed rather than called a duplicate."""
    body = push(int(time.time()))
    guard = client.app[REPLAY]
    assert await guard.first_delivery("gh", body, "d-lost", 600) == "d-lost"
    assert await queued(runtime) == set()
    assert (await post(client, body, "d-lost")).status == 202
    assert (await post(client, body, "d-other")).status == 200
    assert await queued(runtime) == {"webhook:gh:d-lost"}


async def test_window_off_lets_a_fresh_id_through(make_client: Callable[..., Any],
                                                  runtime: Runtime) -> None:
    """Shows what the window stops: without it, the replay is a new item."""
    client = await make_client(create_app(configured(runtime,
                                                     {"gh": {"replay_window_seconds": 0}})))
    body = push(int(time.time()))
    assert [(await post(client, body, d)).status for d in ("d-1", "d-2")] == [202, 202]
    assert [k async for k in runtime.durable.scan_iter("dedup:webhook-body:*")] == []


@pytest.fixture
async def fresh_client(make_client: Callable[..., Any], runtime: Runtime) -> Any:
    webhooks = {"gh": {"freshness_tolerance_seconds": 600, "freshness_fields": {
        "push": "repository.pushed_at", "issues": "issue.updated_at"}}}
    return await make_client(create_app(configured(runtime, webhooks)))


async def test_freshness_refuses_a_stale_payload(fresh_client: Any, runtime: Runtime) -> None:
    stale = await post(fresh_client, push(int(time.time()) - 3600), "d-stale")
    assert stale.status == 400
    answer = await stale.json()
    assert answer["error"] == "stale_delivery"
    assert "repository.pushed_at" in answer["detail"] and "600 s" in answer["detail"]
    assert await queued(runtime) == set()
    # Refused before any write, and not counted by the barrier (the signature was good).
    assert await request_keys(runtime.durable) == []


async def test_freshness_accepts_fresh_events(fresh_client: Any, runtime: Runtime) -> None:
    assert (await post(fresh_client, push(int(time.time()) - 30), "d-push")).status == 202
    updated = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    issue = body_of({"action": "opened", "issue": {"number": 7, "updated_at": updated}})
    assert (await post(fresh_client, issue, "d-issue", event="issues")).status == 202
    assert await queued(runtime) == {"webhook:gh:d-push", "webhook:gh:d-issue"}


@pytest.mark.parametrize(("body", "event", "detail"), [
    (push(int(time.time())), "star", "no freshness field"),  # relabelled: the header is unsigned
    (body_of({"ref": "refs/heads/main"}), "push", "no timestamp at repository.pushed_at"),
    (push("yesterday"), "push", "no timestamp at repository.pushed_at"),
    (push(True), "push", "no timestamp"),  # type: ignore[arg-type]
])
async def test_freshness_needs_a_timestamp(fresh_client: Any, runtime: Runtime, body: bytes,
                                           event: str, detail: str) -> None:
    response = await post(fresh_client, body, "d-x", event=event)
    assert response.status == 400
    answer = await response.json()
    assert answer["error"] == "no_timestamp" and detail in answer["detail"]
    assert await queued(runtime) == set()


@pytest.mark.parametrize(("value", "expected"), [
    (1700000000, 1700000000.0),
    ("2023-11-14T22:13:20Z", 1700000000.0),
    ("2023-11-14T23:13:20+01:00", 1700000000.0),
    ("2023-11-14T22:13:20", 1700000000.0),  # no zone: UTC
    ("not a time", None), (None, None), ([1], None),
])
def test_timestamp_at(value: Any, expected: float | None) -> None:
    assert timestamp_at({"a": {"b": value}}, ("a", "b")) == expected
    assert timestamp_at({"a": 1}, ("a", "b")) is None


def test_policies_from_config(settings: Any) -> None:
    assert policies(settings)["gh"] == ReplayPolicy(window=DEFAULT_WINDOWS["github"])
    assert policies(settings)["demo"].window == 0  # signed timestamp and id: no window
    tuned = dataclasses.replace(settings, sections={"webhooks": {"stripe": {
        "replay_window_seconds": 3600, "freshness_fields": "created"}}})
    assert policies(tuned)["stripe"] == ReplayPolicy(window=3600, fields={"*": ("created",)})


@pytest.mark.parametrize(("webhooks", "variable"), [
    ({"ghh": {}}, "GATEWAY_CONFIG [webhooks.ghh]"),
    ({"gh": {"replay_window": 5}}, "GATEWAY_CONFIG [webhooks.gh].replay_window"),
    ({"gh": {"replay_window_seconds": -1}},
     "GATEWAY_CONFIG [webhooks.gh].replay_window_seconds"),
    ({"gh": {"freshness_tolerance_seconds": "1h"}},
     "GATEWAY_CONFIG [webhooks.gh].freshness_tolerance_seconds"),
    ({"gh": {"freshness_fields": {"push": "a..b"}}},
     "GATEWAY_CONFIG [webhooks.gh].freshness_fields.push"),
    ({"gh": {"freshness_fields": 3}}, "GATEWAY_CONFIG [webhooks.gh].freshness_fields"),
])
def test_config_errors_name_the_setting(settings: Any, webhooks: dict[str, Any],
                                        variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        policies(dataclasses.replace(settings, sections={"webhooks": webhooks}))
    assert caught.value.variable == variable


@pytest.mark.parametrize(("webhooks", "warned"), [
    ({"gh": {"replay_window_seconds": 600, "freshness_tolerance_seconds": 3600,
             "freshness_fields": {"push": "repository.pushed_at"}}}, True),
    ({"gh": {"replay_window_seconds": 0}}, True),  # off: any replay within the tolerance
    ({}, False),  # the defaults: 7 days over 3,600 s
    ({"gh": {"replay_window_seconds": 3600}}, False),
])
def test_a_github_window_shorter_than_its_tolerance_is_warned_at_start(
        runtime: Runtime, caplog: pytest.LogCaptureFixture, webhooks: dict[str, Any],
        warned: bool) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.webhooks")
    create_app(configured(runtime, webhooks))
    said = [r.getMessage() for r in caplog.records if "replay_window_seconds" in r.getMessage()]
    assert bool(said) == warned, said
    if warned:
        assert said[0].startswith("[webhooks.gh]") and "freshness_tolerance_seconds" in said[0]
