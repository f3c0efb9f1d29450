"""Why a store cannot be reached, in one line an operator can act on.

A CLI command that fails on a store (refused connection, wrong password, a socket that is
gone, no answer) gets ``cannot reach redis-durable at <url without password>: <reason>``
instead of a traceback: ``unreachable`` probes the configured stores to name which one, and
``reason`` turns the client library's exception into its cause. ``doctor`` uses the same
reasons. Passwords never appear: URLs are redacted and every password of a configured URL
is blanked from the reason too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from urllib.parse import unquote, urlsplit

import asyncpg
from redis.exceptions import AuthenticationError, RedisError

from gateway.config import Settings, redact_url
from gateway.stores import redis as redis_clients

PROBE_SECONDS = 5.0


def is_store_error(exc: BaseException) -> bool:
    """An error a store (or the way to it) gave, rather than a bug of ours."""
    return isinstance(exc, (RedisError, OSError, TimeoutError, asyncpg.PostgresError,
                            asyncpg.InterfaceError))


def reason(exc: BaseException) -> str:
    """The cause, short: the library's own words where they say it, else the error's kind."""
    if isinstance(exc, AuthenticationError) or "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
        return f"the password was refused ({str(exc).strip() or 'authentication failed'})"
    if isinstance(exc, asyncpg.InvalidPasswordError):
        return f"the password was refused ({exc})"
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"no answer within {PROBE_SECONDS:g} s"
    if isinstance(exc, OSError) and (exc.errno or exc.strerror):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{os.strerror(exc.errno) if exc.errno else exc.strerror}{where}"
    text = " ".join(str(exc).split())
    found = _CONNECTING.match(text)
    if found:  # redis-py: "Error 111 connecting to host:port. <the socket's words>"
        return f"{os.strerror(int(found[1]))} ({found[2]})"
    return text[:300] if text else type(exc).__name__


_CONNECTING = re.compile(r"Error (\d+) connecting to (.+?)\. ")


def _passwords(settings: Settings) -> list[str]:
    found = []
    for url in (settings.durable_url, settings.cache_url, settings.database_url):
        with contextlib.suppress(ValueError):
            password = urlsplit(url or "").password
            if password:
                found += [password, unquote(password)]
    return found


def scrub(text: str, settings: Settings) -> str:
    for password in _passwords(settings):
        text = text.replace(password, "***")
    return text


async def _redis(url: str, variable: str) -> str | None:
    client = redis_clients.connect(url, variable=variable)
    try:
        async with asyncio.timeout(PROBE_SECONDS):
            await client.ping()
        return None
    except Exception as exc:
        return reason(exc)
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()


async def _postgres(url: str) -> str | None:
    try:
        async with asyncio.timeout(PROBE_SECONDS):
            conn = await asyncpg.connect(url)
        await conn.close()
        return None
    except Exception as exc:
        return reason(exc)


async def unreachable(settings: Settings, failure: BaseException | None = None) -> list[str]:
    """One line per configured store that does not answer, ``cannot reach <store> at
    <redacted url>: <reason>``: the kind of store that gave ``failure`` first (a Redis
    error names a Redis role before PostgreSQL), then durable, cache, PostgreSQL."""
    probes = []
    if settings.durable_url:
        probes.append(("redis-durable", settings.durable_url,
                       _redis(settings.durable_url, "GATEWAY_DURABLE_URL")))
    if settings.cache_url:
        probes.append(("redis-cache", settings.cache_url,
                       _redis(settings.cache_url, "GATEWAY_CACHE_URL")))
    if settings.database_url:
        probes.append(("postgres", settings.database_url, _postgres(settings.database_url)))
    if failure is not None and not isinstance(failure, RedisError):
        probes.sort(key=lambda probe: probe[0] != "postgres")  # PostgreSQL's error first
    found = await asyncio.gather(*(probe for _, _, probe in probes))
    return [scrub(f"cannot reach {name} at {redact_url(url)}: {why}", settings)
            for (name, url, _), why in zip(probes, found, strict=True) if why is not None]
