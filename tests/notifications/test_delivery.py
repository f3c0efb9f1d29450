"""Webhook delivery on real servers: every row once, in offset order, signed as Standard
Webhooks with ``webhook-id`` = ``<topic>:<offset>`` (verified by the reference code), the
cursor moved after each 2xx; a failing then recovering endpoint; 429 + Retry-After waited
out; 410 pauses; give-up records the row and goes on; long failure pauses."""

from __future__ import annotations

from typing import Any

from gateway.push import feed
from gateway.stores.runtime import Runtime
from tests.fakes.receiver import Answer, Receiver
from tests.helpers import wait_until
from tests.notifications.conftest import publish, subscribe


async def cursor(runtime: Runtime, sub_id: str, topic: str) -> int | None:
    value = await runtime.pg.fetchval(
        'SELECT "offset" FROM subscription_cursors WHERE subscription_id = $1 AND topic = $2',
        sub_id, topic)
    return None if value is None else int(value)


async def paused(client: Any, sub_id: str) -> bool:
    view = await (await client.get(f"/v1/subscriptions/{sub_id}")).json()
    return bool(view["state"] == "paused")


async def test_rows_arrive_once_in_order_signed(app_with: Any, receiver: Receiver,
                                                runtime: Runtime) -> None:
    client = await app_with()
    await publish(client, "orders", 2)  # before the subscription: not delivered
    made = await subscribe(client, "orders", receiver.endpoint("a", secret=None))
    receiver.secrets["a"] = made["secret"]
    await publish(client, "orders", 5, kind="order.created", text="hi", data={"n": 1})
    await wait_until(lambda: len(receiver.to("a")) >= 5, timeout=15,
                     message="five deliveries")
    got = receiver.to("a")
    assert [d.id for d in got] == [f"orders:{n}" for n in range(3, 8)]
    assert all(d.verified for d in got) and receiver.refused == []
    assert got[0].body["payload"] == {"text": "hi", "data": {"n": 1}}
    assert (got[0].body["topic"], got[0].body["offset"], got[0].body["kind"]) == (
        "orders", 3, "order.created")
    await wait_until(lambda: cursor(runtime, made["id"], "orders"), timeout=5)
    assert await cursor(runtime, made["id"], "orders") == 7
    view = await (await client.get(f"/v1/subscriptions/{made['id']}")).json()
    assert view["cursor"] == {"orders": 7} and view["delivered_at"] is not None


async def test_a_failing_then_recovering_endpoint_gets_every_row_in_order(
        app_with: Any, receiver: Receiver, runtime: Runtime) -> None:
    client = await app_with()
    made = await subscribe(client, "t", receiver.endpoint("flaky"))
    receiver.fail("flaky", 500, times=3)
    await publish(client, "t", 4)
    await wait_until(lambda: len({d.id for d in receiver.to("flaky")}) == 4, timeout=15,
                     message="all four rows after the endpoint recovered")
    ids = receiver.ids("flaky")
    assert ids[:4] == ["t:1"] * 4 and ids[4:] == ["t:2", "t:3", "t:4"]
    gaps = [b.time - a.time for a, b in zip(receiver.to("flaky"), receiver.to("flaky")[1:4],
                                            strict=False)]
    assert gaps[0] >= 0.15 and gaps[1] >= 0.3, gaps  # 0.2 s, then 0.4 s (+-20 %)
    await wait_until(lambda: cursor(runtime, made["id"], "t"), timeout=5)
    row = await runtime.pg.fetchrow("SELECT head_failures, failing_since, last_error"
                                    " FROM subscriptions WHERE id = $1", made["id"])
    assert row["head_failures"] == 0 and row["failing_since"] is None
    assert row["last_error"] == "HTTP 500: ok"
    assert await (await client.get(f"/v1/subscriptions/{made['id']}/failures")).json() == {
        "failures": []}


async def test_429_with_retry_after_is_waited_out_not_counted(
        app_with: Any, receiver: Receiver, runtime: Runtime) -> None:
    client = await app_with(retry_seconds=[30])  # a counted failure would wait 30 s
    made = await subscribe(client, "t", receiver.endpoint("busy"))
    receiver.answer("busy", Answer(429, retry_after="1"))
    await publish(client, "t", 2)
    await wait_until(lambda: len(receiver.to("busy")) >= 3, timeout=10)
    first, second = receiver.to("busy")[:2]
    assert (first.id, second.id) == ("t:1", "t:1") and 0.9 <= second.time - first.time < 5
    assert await runtime.pg.fetchval("SELECT head_failures FROM subscriptions WHERE id = $1",
                                     made["id"]) == 0


async def test_410_pauses_with_last_error(app_with: Any, receiver: Receiver) -> None:
    client = await app_with()
    made = await subscribe(client, "t", receiver.endpoint("gone"))
    receiver.fail("gone", 410)
    await publish(client, "t", 3)

    await wait_until(lambda: paused(client, made["id"]), timeout=10,
                     message="the subscription paused")
    view = await (await client.get(f"/v1/subscriptions/{made['id']}")).json()
    assert "410" in view["last_error"] and view["cursor"] == {}
    assert receiver.ids("gone") == ["t:1"]
    # Resumed, it delivers from where it stopped.
    assert (await client.post(f"/v1/subscriptions/{made['id']}/resume")).status == 200
    await wait_until(lambda: len(receiver.to("gone")) == 4, timeout=10)
    assert receiver.ids("gone") == ["t:1", "t:1", "t:2", "t:3"]


async def test_a_row_past_the_schedule_is_recorded_and_skipped(
        app_with: Any, receiver: Receiver) -> None:
    client = await app_with(retry_seconds=[0.2], give_up_after_seconds=1)
    made = await subscribe(client, "t", receiver.endpoint("bad"))
    receiver.failing_ids["t:1"] = 503  # t:1 always fails; t:2 is taken
    await publish(client, "t", 2)

    async def failures() -> list[dict[str, Any]]:
        answer = await (await client.get(f"/v1/subscriptions/{made['id']}/failures")).json()
        return list(answer["failures"])

    await wait_until(lambda: "t:2" in receiver.ids("bad"), timeout=10)
    [failure] = await failures()
    assert (failure["topic"], failure["offset"], failure["kind"]) == ("t", 1, "event")
    assert failure["attempts"] >= 3 and "503" in failure["error"]
    assert receiver.ids("bad")[-1] == "t:2"


async def test_long_failure_pauses_the_subscription(app_with: Any, receiver: Receiver) -> None:
    client = await app_with(retry_seconds=[0.2], disable_after_seconds=1)
    made = await subscribe(client, "t", receiver.endpoint("down"))
    receiver.fail("down", 502, times=1000)
    await publish(client, "t", 1)

    await wait_until(lambda: paused(client, made["id"]), timeout=10,
                     message="paused after failing 1 s straight")
    view = await (await client.get(f"/v1/subscriptions/{made['id']}")).json()
    assert "failing for" in view["last_error"] and "502" in view["last_error"]


async def test_a_replay_during_delivery_starts_again_after_its_offset(
        app_with: Any, receiver: Receiver, runtime: Runtime) -> None:
    """The row in flight when the replay lands is settled against the position it was sent
    from: the replay is not undone by that row's cursor write."""
    client = await app_with()
    receiver.slow = 0.1
    made = await subscribe(client, "t", receiver.endpoint("r"))
    await publish(client, "t", 12)
    await wait_until(lambda: len(receiver.to("r")) >= 4, timeout=15)
    replayed = await client.post(f"/v1/subscriptions/{made['id']}/replay", json={"after": 0})
    assert replayed.status == 200
    replayed_at = receiver.to("r")[-1].time

    def again() -> list[str]:
        return [d.id for d in receiver.to("r") if d.time > replayed_at]

    await wait_until(lambda: again()[-1:] == ["t:12"], timeout=20, message="replayed to 12")
    after = again()
    assert "t:1" in after, after
    assert after[after.index("t:1"):] == [f"t:{n}" for n in range(1, 13)], after
    await wait_until(lambda: cursor(runtime, made["id"], "t"), timeout=5)
    assert await cursor(runtime, made["id"], "t") == 12


async def test_a_prefix_follows_topics_made_after_it_and_kinds_filter(
        app_with: Any, receiver: Receiver, runtime: Runtime) -> None:
    client = await app_with()
    await publish(client, "alerts:old", 2)  # before the subscription: not delivered
    made = await subscribe(client, "alerts:*", receiver.endpoint("p"), kinds=["page"])
    await publish(client, "alerts:old", kind="page", text="a")
    await publish(client, "alerts:new", kind="info", text="b")  # not a wanted kind
    await publish(client, "alerts:new", kind="page", text="c")
    await publish(client, "other", kind="page", text="d")  # not covered
    await wait_until(lambda: len(receiver.to("p")) >= 2, timeout=15)
    assert receiver.ids("p") == ["alerts:old:3", "alerts:new:2"]
    assert [d.body["payload"]["text"] for d in receiver.to("p")] == ["a", "c"]

    async def cursors() -> dict[str, int]:
        view = await (await client.get(f"/v1/subscriptions/{made['id']}")).json()
        return dict(view["cursor"])

    await wait_until(lambda: cursors(), timeout=5)
    assert await cursors() == {"alerts:old": 3, "alerts:new": 2}


async def test_a_lost_signal_is_made_up_by_the_poll(
        app_with: Any, receiver: Receiver, runtime: Runtime) -> None:
    """A row committed without its push signal (pub/sub is at-most-once) is delivered
    within the poll interval anyway."""
    client = await app_with(poll_seconds=0.5)
    await subscribe(client, "quiet", receiver.endpoint("q"))
    async with runtime.pg.acquire() as conn, conn.transaction():
        await feed.append(conn, "quiet", "event", {"text": "no signal"})
    await wait_until(lambda: receiver.ids("q") == ["quiet:1"], timeout=5,
                     message="the row found by the poll")
