"""Outbound HTTP is hardened: each refusal shown on a real server.

At creation: https only (unless ``allow_http``), and no address in a loopback, private,
link-local, CGNAT, multicast or reserved range, in whatever form it is written (IPv4-mapped,
6to4, NAT64, decimal/octal/hex IPv4, a name that resolves there). On every connection: the
resolver the connector uses checks again, so a name that answered a public address at
creation and a private one later (DNS rebinding) is refused, and nothing reaches the
receiver. No redirect is followed; the time of a request and the size of an answer read are
bounded."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Any

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from gateway.outbound.safe_http import Policy, Refused, SafeClient
from gateway.stores.runtime import Runtime
from tests.fakes.receiver import Answer, Receiver
from tests.helpers import wait_until
from tests.notifications.conftest import publish, subscribe
from tests.notifications.test_subscriptions_api import api_only

REFUSED_AT_CREATION = [
    "http://93.184.216.34/in",  # plain http, allow_http off
    "ftp://93.184.216.34/",
    "https://127.0.0.1/", "https://localhost/", "https://127.1/", "https://2130706433/",
    "https://0x7f.1/", "https://017700000001/", "https://0.0.0.0/",
    "https://10.1.2.3/", "https://172.16.5.4/", "https://192.168.1.10/",
    "https://169.254.169.254/latest/meta-data/", "https://100.64.0.1/",
    "https://224.0.0.1/", "https://240.0.0.1/", "https://255.255.255.255/",
    "https://[::1]/", "https://[::]/", "https://[fe80::1]/", "https://[fd00:ec2::254]/",
    "https://[::ffff:127.0.0.1]/", "https://[::ffff:169.254.169.254]/",
    "https://[2002:7f00:1::]/", "https://[64:ff9b::a9fe:a9fe]/", "https://[ff02::1]/",
]


@pytest.mark.parametrize("url", REFUSED_AT_CREATION)
async def test_unsafe_endpoints_are_refused_at_creation(
        runtime: Runtime, make_client: Any, url: str) -> None:
    client = await make_client(api_only(runtime))
    response = await client.post("/v1/subscriptions", json={
        "topic": "t", "destination": {"type": "webhook", "url": url}})
    answer = await response.json()
    assert response.status == 400, answer
    assert "destination.url" in answer["detail"]
    assert await runtime.pg.fetchval("SELECT count(*) FROM subscriptions") == 0


async def test_a_public_address_is_taken(runtime: Runtime, make_client: Any) -> None:
    client = await make_client(api_only(runtime))
    for url in ("https://93.184.216.34/in", "https://[2606:2800:220:1::1]/in"):
        response = await client.post("/v1/subscriptions", json={
            "topic": "t", "destination": {"type": "webhook", "url": url}})
        assert response.status == 201, await response.text()


async def test_an_endpoint_checked_at_creation_is_checked_again_on_every_connection(
        runtime: Runtime, make_client: Any, app_with: Any, receiver: Receiver) -> None:
    """Made while private addresses were allowed; delivered by a process that refuses them:
    every attempt is refused before a connection, and the error says why."""
    maker = await app_with(deliver=False)
    made = await subscribe(maker, "t", receiver.endpoint("inside"))
    deliverer = await app_with(allow_private_networks=False)
    await publish(deliverer, "t", 1)

    async def refused() -> bool:
        view = await (await deliverer.get(f"/v1/subscriptions/{made['id']}")).json()
        return bool(view["last_error"]) and "refused" in view["last_error"]

    await wait_until(refused, timeout=10, message="the attempt refused")
    assert receiver.deliveries == []


class Rebinding(AbstractResolver):
    """A hostile DNS server: a public address for the first lookup, loopback afterwards."""

    def __init__(self) -> None:
        self.lookups = 0

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        self.lookups += 1
        address = "93.184.216.34" if self.lookups == 1 else "127.0.0.1"
        return [{"hostname": host, "host": address, "port": port, "family": socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        return None


async def test_dns_rebinding_is_refused_at_the_connection(receiver: Receiver) -> None:
    resolver = Rebinding()
    client = SafeClient(Policy(allow_http=True), resolver)
    url = f"http://rebind.example:{receiver.port}/r"
    try:
        await client.check_url(url)  # the first answer is public: taken
        with pytest.raises(Refused):
            await client.post(url, b"{}", {"Content-Type": "application/json"})
    finally:
        await client.close()
    assert resolver.lookups == 2 and receiver.deliveries == []


async def loopback_client(**policy: Any) -> SafeClient:
    return SafeClient(Policy(allow_http=True, allow_private_networks=True, **policy))


async def test_redirects_are_not_followed(receiver: Receiver) -> None:
    receiver.answer("from", Answer(302, location=f"{receiver.url}/to"))
    client = await loopback_client()
    try:
        answer = await client.post(f"{receiver.url}/from", b"{}", {})
    finally:
        await client.close()
    assert answer.status == 302 and receiver.to("to") == []


async def test_a_slow_endpoint_is_given_up_on_after_the_request_time(
        receiver: Receiver) -> None:
    receiver.answer("slow", Answer(200, delay=5))
    client = await loopback_client(request_seconds=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(asyncio.TimeoutError):
            await client.post(f"{receiver.url}/slow", b"{}", {})
    finally:
        await client.close()
    assert time.monotonic() - started < 2


async def test_an_endpoint_that_does_not_accept_is_given_up_on_after_the_connect_time(
        ) -> None:
    """A listener whose accept queue is full drops new SYNs (Linux): the connection never
    opens, and the attempt ends at ``connect_seconds``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue (never accepted)
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    client = await loopback_client(connect_seconds=0.5, request_seconds=10)
    started = time.monotonic()
    try:
        with pytest.raises((asyncio.TimeoutError, aiohttp.ClientError)):
            await client.post(f"http://127.0.0.1:{port}/x", b"{}", {})
    finally:
        await client.close()
        for each in (*fillers, server):
            each.close()
    assert time.monotonic() - started < 3


async def test_at_most_64_kib_of_an_answer_is_read(receiver: Receiver) -> None:
    receiver.answer("big", Answer(200, endless=True))
    client = await loopback_client()
    try:
        answer = await client.post(f"{receiver.url}/big", b"{}", {})
    finally:
        await client.close()
    assert answer.status == 200 and len(answer.body) == 64 * 1024
    # The connection was dropped: the receiver stopped writing far short of its 512 MiB.
    await wait_until(lambda: receiver.endless_ended, timeout=10, message="the answer cut")
    assert receiver.endless_written < 64 * 1024 * 1024


async def test_plain_http_is_refused_on_the_connection_too(receiver: Receiver) -> None:
    client = SafeClient(Policy(allow_http=False, allow_private_networks=True))
    try:
        with pytest.raises(Refused):
            await client.post(f"{receiver.url}/x", b"{}", {})
    finally:
        await client.close()
    assert receiver.deliveries == []
