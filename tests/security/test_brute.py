"""Client address used by the brute-force barrier, and its configuration."""

from __future__ import annotations

import ipaddress

import pytest
from aiohttp.test_utils import make_mocked_request

from gateway.security.brute import BruteSettings, client_ip

PROXIES = BruteSettings.from_section({"trusted_proxies": ["127.0.0.1", "10.0.0.0/8"]})


def request(peer: str, forwarded: str | None = None) -> object:
    headers = {"X-Forwarded-For": forwarded} if forwarded is not None else {}
    req = make_mocked_request("POST", "/v1/webhooks/demo", headers=headers)
    req._transport_peername = (peer, 40000)  # type: ignore[attr-defined]
    return req


@pytest.mark.parametrize(("peer", "forwarded", "expected"), [
    ("203.0.113.1", "198.51.100.7", "203.0.113.1"),  # untrusted peer: header ignored
    ("127.0.0.1", None, "127.0.0.1"),  # trusted proxy, no header: the proxy itself
    ("127.0.0.1", "198.51.100.7", "198.51.100.7"),
    ("127.0.0.1", "6.6.6.6, 198.51.100.7, 10.1.2.3", "198.51.100.7"),  # right-most untrusted
    ("127.0.0.1", "10.0.0.5, 10.1.2.3", "127.0.0.1"),  # only proxies: count the peer
    ("127.0.0.1", "not-an-ip", "127.0.0.1"),  # forged garbage: count the proxy
    ("127.0.0.1", "2001:db8::1", "2001:db8::1"),
])
def test_client_ip(peer: str, forwarded: str | None, expected: str) -> None:
    req = request(peer, forwarded)
    assert client_ip(req, PROXIES.trusted_proxies) == expected  # type: ignore[arg-type]


def test_without_trusted_proxies_the_peer_counts() -> None:
    req = request("127.0.0.1", "198.51.100.7")
    assert client_ip(req, ()) == "127.0.0.1"  # type: ignore[arg-type]


def test_settings_from_section() -> None:
    config = BruteSettings.from_section({"brute_max_failures": 3, "brute_window": 30,
                                         "brute_cooldown": 90, "trusted_proxies": "10.0.0.1"})
    assert (config.max_failures, config.window, config.cooldown) == (3, 30, 90)
    assert config.trusted_proxies == (ipaddress.ip_network("10.0.0.1/32"),)
    assert BruteSettings.from_section({}) == BruteSettings()
