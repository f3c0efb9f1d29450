"""Backpressure and outages on a dedicated redis-durable: 503 + Retry-After, nothing lost,
nothing half-written; and the brute-force barrier per client address."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.exceptions import OutOfMemoryError

from gateway import keys
from gateway.inbound import signing
from gateway.inbound.http_intake import INBOUND
from gateway.pipeline.status import ready_items
from gateway.security.brute import block_key, fail_key
from gateway.stores import redis as redis_clients
from gateway.stores.runtime import Runtime
from gateway.web.app import create_app
from tests.helpers import registry_violations, wait_until
from tests.inbound.webhook_helpers import body_of, standard


@pytest.fixture
async def own_durable(runtime: Runtime, redis_factory: Callable[..., Any]
                      ) -> AsyncIterator[tuple[Any, Runtime]]:
    """A runtime whose redis-durable is a small dedicated server (4 MB, noeviction)."""
    server = redis_factory("durable", maxmemory="4mb")
    durable = redis_clients.connect(server.url, variable="test")
    settings = dataclasses.replace(runtime.settings, durable_url=server.url)
    try:
        yield server, Runtime(settings, durable, runtime.cache, runtime.pg)
    finally:
        await durable.aclose()


async def _closed(admission: Any) -> bool:
    return "webhooks" in (await admission.state())["closed"]


async def _open(admission: Any) -> bool:
    return not await _closed(admission)


async def fill_until_oom(redis: Any, count: int = 0) -> int:
    """Write filler (large, then small values) until even a small write is refused; ``count``
    fillers are there already. Returns how many there are."""
    for size in (64 * 1024, 1024, 16):
        for _ in range(100_000):
            try:
                await redis.set(f"filler:{count}", "f" * size)
            except OutOfMemoryError:
                break
            count += 1
        else:
            raise AssertionError("maxmemory was never reached")
    return count


async def post(client: Any, msg_id: str) -> Any:
    body = body_of({"text": msg_id})
    return await client.post("/v1/webhooks/demo", data=body, headers=standard(body, msg_id))


async def test_maxmemory_is_503_and_keeps_what_was_accepted(
        make_client: Callable[..., Any], own_durable: tuple[Any, Runtime]) -> None:
    _, rt = own_durable
    client = await make_client(create_app(rt))
    accepted = {f"before-{i}" for i in range(20)}
    for msg_id in accepted:
        assert (await post(client, msg_id)).status == 202
    filler = await fill_until_oom(rt.durable)

    refused = await post(client, "during-oom")
    assert refused.status == 503
    assert int(refused.headers["Retry-After"]) > 0
    assert (await refused.json())["error"] == "backpressure"
    # Used memory can fall a little once the refused request's buffers are freed: full again.
    filler = await fill_until_oom(rt.durable, filler)
    job = await client.post("/v1/jobs", json={"job_id": "oom-job", "document": {"text": "x"}})
    assert job.status == 503 and job.headers["Retry-After"]
    # Nothing refused is half-written; everything accepted before is still queued.
    assert await rt.durable.exists(keys.dedup_webhook("demo", "during-oom")) == 0
    assert await rt.durable.exists(keys.dedup_job("oom-job")) == 0
    assert set(await ready_items(rt.durable, "store")) == {
        f"webhook:demo:{m}" for m in accepted}
    # A duplicate of an accepted delivery is still answered while the store is full, also
    # once admission has seen it full and closed to webhooks.
    admission = client.server.app[INBOUND].admission
    await wait_until(lambda: _closed(admission), timeout=10, message="admission closes")
    assert (await post(client, "before-1")).status == 200

    await rt.durable.delete(*(f"filler:{i}" for i in range(filler)))
    await wait_until(lambda: _open(admission), timeout=10, message="admission opens")
    retry = await post(client, "during-oom")  # the sender's retry, after Retry-After
    assert retry.status == 202
    assert len(await ready_items(rt.durable, "store")) == len(accepted) + 1


async def test_unreachable_durable_is_503_then_recovers(
        make_client: Callable[..., Any], own_durable: tuple[Any, Runtime]) -> None:
    server, rt = own_durable
    client = await make_client(create_app(rt))
    assert (await post(client, "first")).status == 202
    server.kill()
    down = await post(client, "while-down")
    assert down.status == 503
    assert down.headers["Retry-After"]
    assert (await down.json())["error"] == "store_unavailable"
    server.start()  # same port and data dir; the AOF brings back what was accepted
    assert (await post(client, "while-down")).status == 202
    assert set(await ready_items(rt.durable, "store")) == {
        "webhook:demo:first", "webhook:demo:while-down"}


@pytest.fixture
async def proxied(make_client: Callable[..., Any], runtime: Runtime) -> Any:
    """The app behind a trusted proxy (the test client's 127.0.0.1), a barrier of 3."""
    security = {"trusted_proxies": ["127.0.0.1"], "brute_max_failures": 3,
                "brute_window": 60, "brute_cooldown": 120}
    settings = dataclasses.replace(runtime.settings, sections={"security": security})
    return await make_client(create_app(dataclasses.replace(runtime, settings=settings)))


async def bad(client: Any, ip: str) -> Any:
    body = body_of({"text": "guess"})
    headers = {**standard(body, "guess"), "webhook-signature": "v1,Z3Vlc3M=",
               "X-Forwarded-For": f"{ip}, 127.0.0.1"}
    return await client.post("/v1/webhooks/demo", data=body, headers=headers)


async def good(client: Any, ip: str, msg_id: str) -> Any:
    body = body_of({"text": msg_id})
    headers = {**standard(body, msg_id), "X-Forwarded-For": ip}
    return await client.post("/v1/webhooks/demo", data=body, headers=headers)


async def test_brute_force_barrier_blocks_one_address_only(proxied: Any,
                                                           runtime: Runtime) -> None:
    assert [(await bad(proxied, "203.0.113.7")).status for _ in range(3)] == [401, 401, 429]
    blocked = await good(proxied, "203.0.113.7", "valid-but-blocked")
    assert blocked.status == 429
    assert 0 < int(blocked.headers["Retry-After"]) <= 120
    assert (await good(proxied, "198.51.100.2", "other-sender")).status == 202
    assert await runtime.durable.exists(block_key("203.0.113.7")) == 1
    assert await runtime.durable.exists(keys.dedup_webhook("demo", "valid-but-blocked")) == 0
    assert await registry_violations(runtime.durable, "durable") == []


async def test_failures_below_threshold_expire_with_the_window(proxied: Any,
                                                               runtime: Runtime) -> None:
    for _ in range(2):
        assert (await bad(proxied, "192.0.2.9")).status == 401
    assert 0 < await runtime.durable.ttl(fail_key("192.0.2.9")) <= 60
    await runtime.durable.delete(fail_key("192.0.2.9"))  # the window passed
    assert [(await bad(proxied, "192.0.2.9")).status for _ in range(2)] == [401, 401]


async def test_forwarded_for_is_ignored_without_trusted_proxies(client: Any,
                                                                runtime: Runtime) -> None:
    assert (await bad(client, "203.0.113.50")).status == 401
    assert await runtime.durable.exists(fail_key("127.0.0.1")) == 1
    assert await runtime.durable.exists(fail_key("203.0.113.50")) == 0


async def test_stale_but_genuine_signatures_are_refused_without_counting(
        proxied: Any, runtime: Runtime) -> None:
    """A replay of a correctly signed request past the tolerance proves nothing was guessed:
    401 every time, never a block, so a sender with a skewed clock is not locked out."""
    body = body_of({"text": "old"})
    old = int(time.time()) - signing.TOLERANCE_SECONDS - 60
    headers = {**standard(body, "old-1", timestamp=old), "X-Forwarded-For": "203.0.113.30"}
    answers = [await proxied.post("/v1/webhooks/demo", data=body, headers=headers)
               for _ in range(5)]  # more than the barrier's 3
    assert [a.status for a in answers] == [401] * 5
    assert {(await a.json())["error"] for a in answers} == {"stale_signature"}
    assert await runtime.durable.exists(fail_key("203.0.113.30")) == 0
    assert (await good(proxied, "203.0.113.30", "fresh-now")).status == 202


@pytest.mark.parametrize("headers", [
    {"Content-Type": "application/json"},  # garbage: no signature headers at all
    {"Content-Type": "application/json", "webhook-id": "g", "webhook-timestamp": "soon",
     "webhook-signature": "v1,AAAA"},  # garbage: a timestamp that is not one
], ids=["no-headers", "bad-timestamp"])
async def test_garbage_counts_like_a_wrong_signature(proxied: Any, runtime: Runtime,
                                                     headers: dict[str, str]) -> None:
    sent = {**headers, "X-Forwarded-For": "203.0.113.31"}
    statuses = [(await proxied.post("/v1/webhooks/demo", data=b"{}", headers=sent)).status
                for _ in range(3)]
    assert statuses == [401, 401, 429]
    assert await runtime.durable.exists(block_key("203.0.113.31")) == 1


async def test_never_block_ranges_are_refused_but_never_blocked(
        make_client: Callable[..., Any], runtime: Runtime) -> None:
    """A platform's shared range (someone else's hook with a wrong secret pointed at us):
    its wrong signatures get 401 but never block the range, so our own deliveries from the
    same addresses still get through; an address outside it is blocked as usual."""
    security = {"trusted_proxies": ["127.0.0.1"], "brute_max_failures": 3,
                "never_block": ["192.0.2.0/24"]}
    settings = dataclasses.replace(runtime.settings, sections={"security": security})
    client = await make_client(create_app(dataclasses.replace(runtime, settings=settings)))
    assert [(await bad(client, "192.0.2.10")).status for _ in range(5)] == [401] * 5
    assert (await good(client, "192.0.2.10", "ours-from-the-platform")).status == 202
    assert [k async for k in runtime.durable.scan_iter("brute:*")] == []
    assert [(await bad(client, "198.51.100.77")).status for _ in range(3)] == [401, 401, 429]


async def test_an_attacker_rotating_through_its_ipv6_64_is_blocked_not_its_neighbours(
        proxied: Any, runtime: Runtime) -> None:
    """Behind the same trusted proxy: a fresh address of the same /64 per guess still
    counts as one client; a sender in the next /64 is accepted throughout."""
    guesses = [(await bad(proxied, f"2001:db8:0:1::{n:x}")).status for n in range(1, 4)]
    assert guesses == [401, 401, 429]
    assert (await good(proxied, "2001:db8:0:1::ff", "same-64")).status == 429
    assert (await good(proxied, "2001:db8:0:2::1", "next-64")).status == 202
    assert await runtime.durable.exists(block_key("2001:db8:0:1::/64")) == 1
