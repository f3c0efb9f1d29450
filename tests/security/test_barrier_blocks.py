"""A lockout that helps (issue 28): under ``gateway dev`` loopback clients are never blocked,
``serve`` blocks exactly as before; a block is logged once with its count and cool-down;
``gateway barrier list|clear`` and ``GET|DELETE /v1/admin/barrier`` show and lift blocks."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from gateway.api.errors import ApiError
from gateway.inbound.http_intake import INBOUND
from gateway.security.brute import block_key, fail_key
from gateway.web.app import create_app
from tests.conftest import TEST_ADMIN_TOKEN
from tests.helpers import gateway_cli, wait_until

ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}
WRONG = {"Authorization": "Bearer wrong"}
LOOPBACK = "127.0.0.1"
OTHER = "198.51.100.7"


async def _wrong_credentials(client: Any, count: int) -> list[int]:
    statuses = []
    for _ in range(count):
        resp = await client.get("/v1/admin/queues", headers=WRONG)
        statuses.append(resp.status)
    return statuses


async def test_dev_never_blocks_a_loopback_client(runtime, make_client) -> None:  # type: ignore[no-untyped-def]
    """Twenty wrong credentials from 127.0.0.1 under ``gateway dev``: each a plain 401, the
    admin token still works, and the barrier counted nothing for loopback."""
    rt = dataclasses.replace(runtime, settings=dataclasses.replace(runtime.settings, dev=True))
    client = await make_client(create_app(rt), rt=rt)
    assert await _wrong_credentials(client, 20) == [401] * 20
    assert (await client.get("/v1/admin/queues", headers=ADMIN)).status == 200
    assert [k async for k in runtime.durable.scan_iter("brute:*")] == []
    # Other addresses are still counted and blocked under dev: only loopback is exempt.
    barrier = client.app[INBOUND].barrier
    for _ in range(9):
        assert await barrier.record_failure(OTHER) == 0
    assert await barrier.record_failure(OTHER) == 300


async def test_serve_blocks_loopback_as_before_and_logs_it_once(
        runtime, make_client, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """``serve`` (no dev flag): the 10th wrong credential blocks 127.0.0.1 for 300 s, every
    request then gets 429, the admin token's too; the log names the block once."""
    client = await make_client()
    with caplog.at_level("WARNING", logger="gateway.security"):
        statuses = await _wrong_credentials(client, 15)
        assert (await client.get("/v1/admin/queues", headers=ADMIN)).status == 429
    assert statuses == [401] * 9 + [429] * 6
    assert 290 < await runtime.durable.ttl(block_key(LOOPBACK)) <= 300
    lines = [r.getMessage() for r in caplog.records if "blocked for" in r.getMessage()]
    assert lines == [f"barrier: {LOOPBACK} blocked for 300 s after 10 failed signatures or "
                     f"credentials within 60 s (every request from it gets 429); "
                     f"`gateway barrier clear {LOOPBACK}` lifts it"]


async def test_admin_barrier_lists_and_lifts_blocks(runtime, make_client) -> None:  # type: ignore[no-untyped-def]
    client = await make_client()
    barrier = client.app[INBOUND].barrier
    for address in (OTHER, "2001:db8::/64"):
        for _ in range(10):
            await barrier.record_failure(address)
    await barrier.record_failure("203.0.113.9")  # counted, not blocked: not listed
    await runtime.durable.set("brute:{link:telegram:1}:block", "1", ex=900)  # a chat's
    resp = await client.get("/v1/admin/barrier")
    assert resp.status == 200
    blocked = (await resp.json())["blocked"]
    assert sorted(b["address"] for b in blocked) == ["198.51.100.7", "2001:db8::/64"]
    assert all(290 < b["expires_in"] <= 300 for b in blocked)
    # A client's own IPv6 address names its /64.
    resp = await client.delete("/v1/admin/barrier", params={"address": "2001:db8::abcd"})
    assert (resp.status, await resp.json()) == (200, {"cleared": ["2001:db8::/64"]})
    assert await runtime.durable.exists(block_key("2001:db8::/64")) == 0
    resp = await client.delete("/v1/admin/barrier", params={"all": "true"})
    assert (await resp.json()) == {"cleared": ["198.51.100.7"]}
    assert (await (await client.get("/v1/admin/barrier")).json()) == {"blocked": []}
    assert await runtime.durable.exists("brute:{link:telegram:1}:block") == 1

    async def lifted() -> bool:  # this process trusts its memory of the block for 1 s
        try:
            await barrier.check(OTHER)
        except ApiError:
            return False
        return True

    await wait_until(lifted, timeout=5)
    for params in ({}, {"all": "yes"}, {"all": "true", "address": OTHER}, {"address": ""}):
        resp = await client.delete("/v1/admin/barrier", params=params)
        assert resp.status == 400, params
    for method in ("GET", "DELETE"):
        resp = await client.request(method, "/v1/admin/barrier", headers={"Authorization": ""})
        assert resp.status == 401


async def test_cli_clears_a_locked_out_loopback_client(runtime, make_client, servers) -> None:  # type: ignore[no-untyped-def]
    """Locked out of one's own server: ``gateway barrier list`` shows the block and
    ``gateway barrier clear 127.0.0.1`` lifts it; the running server serves again within
    a second (its memory of the block lasts ``brute_cache_seconds``)."""
    client = await make_client()
    await _wrong_credentials(client, 10)
    assert (await client.get("/v1/admin/queues", headers=ADMIN)).status == 429
    code, out, err = await gateway_cli(servers, "barrier", "list")
    assert code == 0, err
    assert [json.loads(line)["address"] for line in out.splitlines()] == [LOOPBACK]
    code, out, err = await gateway_cli(servers, "barrier", "clear", LOOPBACK)
    assert (code, json.loads(out)) == (0, {"cleared": [LOOPBACK]}), err
    assert await runtime.durable.exists(block_key(LOOPBACK), fail_key(LOOPBACK)) == 0

    async def served() -> bool:
        return (await client.get("/v1/admin/queues", headers=ADMIN)).status == 200

    await wait_until(served, timeout=5)
    code, _, err = await gateway_cli(servers, "barrier", "clear")
    assert code != 0 and "ADDRESS or --all" in err
    code, out, _ = await gateway_cli(servers, "barrier", "clear", "--all")
    assert (code, out.strip()) == (0, '{"cleared": []}')
