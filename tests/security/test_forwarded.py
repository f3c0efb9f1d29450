"""``X-Forwarded-For`` behind a proxy that appends its own header line (HAProxy does): every
line is read, every form is parsed, the chain is taken right to left. On a real gateway with
real Redis: the attacker who forges the first line is the one blocked, never its victim."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from multidict import CIMultiDict

from gateway.config import Settings
from gateway.security import forwarded
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app

BAD = "Bearer not-a-credential"
PROXY = ipaddress.ip_network("127.0.0.1/32")  # the test client is the "proxy"


@pytest.mark.parametrize(("entry", "expected"), [
    ("198.51.100.7", "198.51.100.7"),
    (" 198.51.100.7:5555 ", "198.51.100.7"),
    ("[2001:db8::7]:443", "2001:db8::7"),
    ("[2001:db8::7]", "2001:db8::7"),
    ("2001:db8::7", "2001:db8::7"),
    ("198.51.100.7:", None),
    ("198.51.100.7:99999999", None),
    ("[198.51.100.7]:80", None),
    ("[2001:db8::7", None),
    ("unknown", None),
    ("", None),
])
def test_every_form_of_an_entry(entry: str, expected: str | None) -> None:
    parsed = forwarded.parse_entry(entry)
    assert (None if parsed is None else str(parsed)) == expected


def test_the_chain_spans_every_line_right_to_left() -> None:
    lines = ["6.6.6.6, 10.0.0.1", "198.51.100.7:1234", "127.0.0.1"]
    trusted = (PROXY, ipaddress.ip_network("10.0.0.0/8"))
    assert str(forwarded.client(lines, trusted)) == "198.51.100.7"
    assert forwarded.client(["garbage", "127.0.0.1"], trusted) is None
    assert forwarded.client(["10.0.0.1", "127.0.0.1"], trusted) is None  # only proxies


async def _status(client: TestClient[Any, Any], *lines: str) -> int:
    headers = CIMultiDict([("Authorization", BAD)] + [("X-Forwarded-For", v) for v in lines])
    async with client.get("/v1/admin/queues", headers=headers) as response:
        return response.status


async def test_a_forged_first_line_blocks_the_attacker_not_its_victim(
        runtime: Runtime, settings: Settings, make_client: Callable[..., Any]) -> None:
    """The default barrier (10 refused credentials): the attacker writes the victim's address
    in its own X-Forwarded-For line; the proxy appends a line with the attacker's address.
    Ten refusals block the attacker (the proxy's line), the victim is never blocked; an
    attacker written ``ip:port`` or ``[v6]:port`` by its proxy is counted too."""
    rt = await open_runtime(dataclasses.replace(
        settings, sections={"security": {"trusted_proxies": ["127.0.0.1"]}}))
    try:
        client = await make_client(create_app(rt), rt=rt)
        victim, attackers = "203.0.113.50", ("198.51.100.7", "198.51.100.8:40000",
                                             "[2001:db8::7]:443")
        for attacker in attackers:
            for _ in range(9):
                assert await _status(client, victim, attacker) == 401
            assert await _status(client, victim, attacker) == 429  # the tenth blocks it
            assert await _status(client, attacker) == 429  # whatever its first line says
        assert await _status(client, victim) == 401  # refused, never blocked
        assert sorted([key async for key in runtime.durable.scan_iter("brute:*:block")]) == [
            "brute:{198.51.100.7}:block", "brute:{198.51.100.8}:block",
            "brute:{2001:db8::/64}:block"]
    finally:
        await rt.close()
