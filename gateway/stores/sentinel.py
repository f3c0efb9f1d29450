"""``redis+sentinel://`` / ``rediss+sentinel://`` URLs, for failover setups watched by Sentinel:

    redis+sentinel://[[user]:password@]host:port[,host:port...]/<service>[/db][?sentinel_password=...]

The password authenticates to the Redis master (and replicas) and, unless
``sentinel_password`` is given, to the sentinels too (an empty ``sentinel_password=`` means
sentinels without a password). The client asks the sentinels for the master of ``service`` on
every new connection; after a failover the demoted master answers ``READONLY``, redis-py drops
that connection and the retry reconnects to the new master.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection
from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection

from gateway.config import ConfigError

_SHAPE = "sentinel URL needs host:port[,host:port]/service_name[/db]"


@dataclass(frozen=True)
class SentinelUrl:
    nodes: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None
    sentinel_password: str | None
    tls: bool


def parse(url: str, *, variable: str) -> SentinelUrl:
    """The parts of a sentinel URL; a ConfigError naming ``variable`` when malformed."""
    parts = urlsplit(url)
    hosts = parts.netloc.rsplit("@", 1)[-1]
    path = [p for p in parts.path.split("/") if p]
    if not hosts or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigError(variable, _SHAPE)
    nodes = []
    for node in hosts.split(","):
        host, _, port = node.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(variable, _SHAPE)
        nodes.append((host.strip("[]"), int(port)))
    password = unquote(parts.password) if parts.password else None
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = set(query) - {"sentinel_password"}
    if unknown:
        raise ConfigError(variable, f"unknown sentinel URL option {sorted(unknown)[0]!r}")
    sentinel_password = password
    if "sentinel_password" in query:
        sentinel_password = query["sentinel_password"][-1] or None
    return SentinelUrl(
        nodes=tuple(nodes), service=unquote(path[0]), db=int(path[1]) if len(path) > 1 else 0,
        username=unquote(parts.username) if parts.username else None, password=password,
        sentinel_password=sentinel_password, tls=parts.scheme.startswith("rediss"))


class FollowingConnection(SentinelManagedConnection):
    """A master connection that asks the sentinels again on *every* reconnect.

    redis-py reconnects inside a command's retry loop through ``connect_check_health``, which
    reuses the old host and port (redis/redis-py#3874, open): after a failover the retries
    all hit the demoted master and the caller gets the error. Resolving the address here
    makes the first write after a failover land on the new master.
    """

    async def connect_check_health(self, check_health: bool = True,
                                   retry_socket_connect: bool = True) -> None:
        if not self.is_connected and self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(check_health=check_health,
                                           retry_socket_connect=retry_socket_connect)


class FollowingSSLConnection(FollowingConnection, SSLConnection):
    pass


def connect_sentinel(url: str, *, variable: str, **options: Any) -> aioredis.Redis:
    """A client of the service's current master; ``options`` go to every master connection."""
    spec = parse(url, variable=variable)
    probe = {key: options[key] for key in ("socket_connect_timeout", "decode_responses",
                                           "protocol") if key in options}
    sentinel = Sentinel(
        list(spec.nodes),
        sentinel_kwargs={"password": spec.sentinel_password, "ssl": spec.tls,
                         "socket_timeout": options.get("socket_connect_timeout"), **probe},
        ssl=spec.tls, username=spec.username, password=spec.password, db=spec.db, **options)
    client: aioredis.Redis = sentinel.master_for(
        spec.service,
        connection_class=FollowingSSLConnection if spec.tls else FollowingConnection)
    return client
