"""Client address used by the brute-force barrier, and its configuration."""

from __future__ import annotations

import ipaddress

import pytest
from aiohttp.test_utils import make_mocked_request

from gateway.config import ConfigError
from gateway.security.brute import BruteSettings, client_ip

PROXIES = BruteSettings.from_section({"trusted_proxies": ["127.0.0.1", "10.0.0.0/8"]})


def request(peer: str, forwarded: str | None = None) -> object:
    headers = {"X-Forwarded-For": forwarded} if forwarded is not None else {}
    req = make_mocked_request("POST", "/v1/webhooks/demo", headers=headers)
    req._transport_peername = (peer, 40000)  # type: ignore[attr-defined]
    return req


@pytest.mark.parametrize(("peer", "forwarded", "expected"), [
    ("203.0.113.1", "198.51.100.7", "203.0.113.1"),  # untrusted peer: header ignored
    ("127.0.0.1", None, ""),  # trusted proxy, no header: nobody to count, never the proxy
    ("127.0.0.1", "198.51.100.7", "198.51.100.7"),
    ("127.0.0.1", "6.6.6.6, 198.51.100.7, 10.1.2.3", "198.51.100.7"),  # right-most untrusted
    ("127.0.0.1", "10.0.0.5, 10.1.2.3", ""),  # only proxies: nobody to count, never the proxy
    ("127.0.0.1", "not-an-ip", ""),  # forged garbage: nobody to count, never the proxy
    ("127.0.0.1", "2001:db8::1", "2001:db8::/64"),  # IPv6 counted by its /64
    ("127.0.0.1", "2001:db8::1:2:3:4", "2001:db8::/64"),  # the same /64: the same client
    ("2001:db8:0:1::9", None, "2001:db8:0:1::/64"),
    ("127.0.0.1", "::ffff:198.51.100.7", "198.51.100.7"),
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


async def test_a_request_naming_no_client_never_blocks_the_proxy(runtime) -> None:  # type: ignore[no-untyped-def]
    """Garbage through a trusted proxy counts nothing: the proxy, and everyone behind it,
    stays unblocked; a named client is counted and blocked as usual."""
    from gateway.security.brute import NOBODY, BruteBarrier
    from gateway.stores.coalesce import AutoPipeline
    barrier = BruteBarrier(AutoPipeline(runtime.durable), BruteSettings(max_failures=2))
    for _ in range(5):
        assert await barrier.record_failure(NOBODY) == 0
    await barrier.check(NOBODY)  # not refused
    assert [key async for key in runtime.durable.scan_iter("brute:*")] == []
    assert await barrier.record_failure("2001:db8::/64") == 0
    assert await barrier.record_failure("2001:db8::/64") > 0  # the second failure blocks


def test_never_block_ranges_count_as_nobody() -> None:
    config = BruteSettings.from_section({"trusted_proxies": ["127.0.0.1"],
                                         "never_block": "192.0.2.0/24, 2001:db8:1::/48"})
    assert config.never_block == (ipaddress.ip_network("192.0.2.0/24"),
                                  ipaddress.ip_network("2001:db8:1::/48"))
    for peer, forwarded, expected in [
        ("127.0.0.1", "192.0.2.9", ""),  # behind the proxy, inside the range
        ("192.0.2.9", None, ""),  # direct, inside the range
        ("127.0.0.1", "2001:db8:1:5::1", ""),
        ("127.0.0.1", "198.51.100.7", "198.51.100.7"),  # outside: counted as usual
    ]:
        got = client_ip(request(peer, forwarded), config.trusted_proxies,  # type: ignore[arg-type]
                        config.never_block)
        assert got == expected, (peer, forwarded)


def test_bad_never_block_is_named() -> None:
    with pytest.raises(ConfigError) as caught:
        BruteSettings.from_section({"never_block": ["github"]})
    assert caught.value.variable == "GATEWAY_CONFIG [security].never_block"


async def test_an_untrusted_forwarder_is_named_once_in_the_log(
        runtime, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """A proxy missing from trusted_proxies would get everyone behind it blocked together:
    the log says so, once per address and for a bounded number of addresses."""
    from gateway.security.brute import BruteBarrier
    from gateway.stores.coalesce import AutoPipeline
    barrier = BruteBarrier(AutoPipeline(runtime.durable), PROXIES)
    with caplog.at_level("WARNING", logger="gateway.security"):
        for _ in range(3):
            assert barrier.client_ip(request("203.0.113.1", "198.51.100.7")) == "203.0.113.1"
        barrier.client_ip(request("127.0.0.1", "198.51.100.7"))  # a trusted proxy: silent
        barrier.client_ip(request("203.0.113.2"))  # no header: silent
        for n in range(3, 3 + 2 * BruteBarrier.MAX_WARNED):
            barrier.client_ip(request(f"203.0.113.{n}", "198.51.100.7"))
    warned = [r.getMessage() for r in caplog.records if "trusted_proxies" in r.getMessage()]
    assert len(warned) == BruteBarrier.MAX_WARNED
    assert warned[0].startswith("203.0.113.1 sent X-Forwarded-For")
