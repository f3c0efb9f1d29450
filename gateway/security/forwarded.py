"""The client address behind trusted proxies, from ``X-Forwarded-For``.

Every header line counts, joined in order (RFC 9110 §5.3: several lines of a list header are
one list): a proxy such as HAProxy appends its own line rather than extending the client's,
so reading only the first would take the client's own words. Each entry may be written
``ip``, ``ip:port``, ``[v6]``, ``[v6]:port`` or a bare ``v6``. The chain is read right to
left: entries that are trusted proxies are skipped, the first other one is the client. An
entry that is not an address there means the chain cannot be trusted past it: nobody."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_ENTRIES = 64  # a chain longer than any real path of proxies is read from its end only


def parse_entry(entry: str) -> Address | None:
    """One ``X-Forwarded-For`` entry in any of its forms, or None for anything else."""
    text = entry.strip()
    if text.startswith("["):  # [v6] or [v6]:port
        inside, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not _port(rest)):
            return None
        return _address(inside, v6_only=True)
    if text.count(":") == 1:  # v4:port
        host, _, port = text.partition(":")
        return _address(host, v4_only=True) if _port(":" + port) else None
    return _address(text)  # v4, or a bare v6 (two colons or more)


def _port(text: str) -> bool:
    digits = text[1:]
    return text.startswith(":") and digits.isdigit() and len(digits) <= 5


def _address(text: str, *, v4_only: bool = False, v6_only: bool = False) -> Address | None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if (v4_only and address.version != 4) or (v6_only and address.version != 6):
        return None
    return address


def entries(lines: Iterable[str]) -> list[str]:
    """The chain's entries, left to right, from every header line (the last MAX_ENTRIES)."""
    return [e for e in ",".join(lines).split(",") if e.strip()][-MAX_ENTRIES:]


def client(lines: Iterable[str], trusted: tuple[Network, ...]) -> Address | None:
    """The right-most entry that is not a trusted proxy; None when there is none, or when
    an entry before it (from the right) is not an address."""
    for entry in reversed(entries(lines)):
        address = parse_entry(entry)
        if address is None:
            return None
        if not any(address in net for net in trusted):
            return address
    return None
