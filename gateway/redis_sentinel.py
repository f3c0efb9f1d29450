"""``redis+sentinel://[:password@]host:port[,host:port...]/<service>[/db]`` URLs."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from redis.asyncio.sentinel import Sentinel

from gateway.config import ConfigError


def connect_sentinel(url: str, *, variable: str, **options: Any) -> Any:
    parts = urlsplit(url)
    hosts = parts.netloc.rsplit("@", 1)[-1]
    path = [p for p in parts.path.split("/") if p]
    if not hosts or not path:
        raise ConfigError(variable, "sentinel URL needs host:port[,host:port]/service_name")
    nodes = []
    for node in hosts.split(","):
        host, _, port = node.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(variable, "sentinel URL needs host:port[,host:port]/service_name")
        nodes.append((host.strip("[]"), int(port)))
    password = unquote(parts.password) if parts.password else None
    username = unquote(parts.username) if parts.username else None
    db = int(path[1]) if len(path) > 1 and path[1].isdigit() else 0
    tls = parts.scheme.startswith("rediss")
    sentinel = Sentinel(nodes, sentinel_kwargs={"password": password, "username": username},
                        ssl=tls, password=password, username=username, db=db, **options)
    return sentinel.master_for(path[0])
