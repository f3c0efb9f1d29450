"""Outbound HTTP to addresses users chose (subscription endpoints): an attack surface.

- ``https`` only, unless plain ``http`` is allowed (development, tests).
- No connection to a loopback, private, link-local, CGNAT, multicast, reserved, unspecified
  or otherwise non-global address, unless private networks are allowed: checked when the URL
  is given (``check_url``) and again on every connection. Validating a name and then letting
  the client resolve it again lets a hostile DNS server answer a public address first and
  ``169.254.169.254`` next (DNS rebinding), so the check sits in the resolver the connector
  itself calls (``CheckedResolver``): the connection goes to an address that was checked,
  and TLS still verifies the host name. An IP literal in the URL, which the connector does
  not resolve, is checked before the request. Addresses that hide an IPv4 address
  (IPv4-mapped, 6to4, NAT64, Teredo) are judged by that address too.
- No redirects followed (a 3xx is an answer like any other), ``connect_seconds`` to connect,
  ``request_seconds`` for the whole request, at most ``max_answer_bytes`` of an answer read;
  no proxy from the environment.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


class Refused(OSError):
    """The destination is not allowed (its scheme, or an address it resolves to)."""


@dataclass(frozen=True)
class Policy:
    allow_http: bool = False
    allow_private_networks: bool = False
    connect_seconds: float = 5.0
    request_seconds: float = 15.0
    max_answer_bytes: int = 64 * 1024
    max_connections: int = 100


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for, if it is one of the forms that carry one."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client's address
    if address in _NAT64 or address in _NAT64_LOCAL:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_allowed(address: Address) -> bool:
    """Only globally routable unicast addresses (and, for IPv6 forms that carry an IPv4
    address, only when that address is one too)."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_v4(address)
        if inner is not None and not address_allowed(inner):
            return False
        if address in _NAT64 or address in _NAT64_LOCAL:
            return True  # judged by the IPv4 address it carries
    return (address.is_global and not address.is_multicast and not address.is_reserved
            and not address.is_unspecified)


def check_address(text: str) -> None:
    """``Refused`` unless ``text`` (an address) is allowed."""
    address = ipaddress.ip_address(text.split("%", 1)[0])  # no zone index
    if not address_allowed(address):
        raise Refused(f"address {address} is not a public one (private, loopback, "
                      "link-local, CGNAT, multicast or reserved)")


class LazyResolver(AbstractResolver):
    """A resolver made on first use: aiohttp's wants a running loop, and the app is built
    (``create_app``) before the loop may run."""

    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self._inner = inner

    @property
    def inner(self) -> AbstractResolver:
        if self._inner is None:
            self._inner = DefaultResolver()
        return self._inner

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        return await self.inner.resolve(host, port, family)

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()


class CheckedResolver(LazyResolver):
    """The connector's resolver: every address a name resolves to must be allowed, else the
    whole lookup is refused (a name that also points inward is not trusted outward)."""

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await super().resolve(host, port, family)
        for result in results:
            check_address(result["host"])
        return results


def _ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes  # at most max_answer_bytes of it


class SafeClient:
    """One per process: a session whose connector resolves through ``CheckedResolver``
    (unless private networks are allowed) and refuses what ``Policy`` refuses."""

    def __init__(self, policy: Policy, resolver: AbstractResolver | None = None) -> None:
        self.policy = policy
        checked = policy.allow_private_networks is False
        self.resolver: AbstractResolver = (CheckedResolver(resolver) if checked
                                           else LazyResolver(resolver))
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                resolver=self.resolver, limit=self.policy.max_connections,
                use_dns_cache=False, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=self.policy.request_seconds,
                                              sock_connect=self.policy.connect_seconds))
        return self._session

    async def check_url(self, url: str) -> None:
        """At the door (a subscription being made): ``Refused`` unless its scheme is
        allowed and every address its host resolves to is (one lookup, now)."""
        parsed = self._checked_url(url)
        if self.policy.allow_private_networks:
            return
        host = parsed.raw_host or ""
        if _ip_literal(host):
            return  # checked by _checked_url
        try:
            async with asyncio.timeout(self.policy.connect_seconds):
                await self.resolver.resolve(host, parsed.port or 443, socket.AF_UNSPEC)
        except Refused:
            raise
        except (OSError, TimeoutError) as exc:
            raise Refused(f"cannot resolve {host[:100]}: {type(exc).__name__}") from None

    def target(self, url: str) -> URL:
        """``url`` parsed and checked once (its scheme, an IP literal's address), for a
        sender that posts to it again and again; its name is checked at every connection."""
        return self._checked_url(url)

    def _checked_url(self, url: str) -> URL:
        parsed = URL(url)
        schemes = ("https", "http") if self.policy.allow_http else ("https",)
        if parsed.scheme not in schemes:
            raise Refused(f"scheme {parsed.scheme[:20]}:// is not allowed (https only"
                          + (")" if self.policy.allow_http else
                             "; [notifications] allow_http is off)"))
        host = parsed.raw_host or ""
        if not host:
            raise Refused("the URL has no host")
        if _ip_literal(host) and not self.policy.allow_private_networks:
            check_address(host)
        return parsed

    async def post(self, url: str | URL, body: bytes, headers: Mapping[str, str]) -> Answer:
        """POST ``body`` to ``url`` (a string, or a ``target``); the answer with at most
        ``max_answer_bytes`` of its body. Raises ``Refused`` (not allowed), ``TimeoutError``
        or ``aiohttp.ClientError``."""
        parsed = url if isinstance(url, URL) else self._checked_url(url)
        try:
            async with self.session().post(parsed, data=body, headers=headers,
                                           allow_redirects=False) as response:
                answer = await read_at_most(response.content, self.policy.max_answer_bytes)
                if not response.content.at_eof():
                    response.close()  # the rest is not read: drop the connection
                return Answer(response.status, dict(response.headers), answer)
        except aiohttp.ClientConnectorDNSError as exc:
            refused = _refusal(exc)
            if refused is not None:
                raise refused from None
            raise

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def read_at_most(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``stream`` (fewer at its end); the rest stays unread."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = await stream.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _refusal(exc: Any) -> Refused | None:
    cause = getattr(exc, "os_error", None) or exc.__cause__
    return cause if isinstance(cause, Refused) else None
