"""``gateway dev``: the whole stack on one machine with nothing installed but the package.

Starts (unless the matching ``GATEWAY_*_URL`` is set) a durable and a cache Redis with the
``deploy/redis`` configurations and a PostgreSQL server, all under ``./.gateway/``; applies
migrations; runs the HTTP server and the pipeline workers in this process. Passwords and a
demo webhook secret are generated once and kept in ``.gateway/secrets.json`` so a second run
reuses the data. SIGINT/SIGTERM stop everything; the servers also die with this process.
One ``gateway dev`` per data dir (``gateway.app.devstack``: a second refuses and touches
nothing), and while it serves, every other command run in the folder uses its stack.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import secrets
import shlex
import sys
from pathlib import Path
from typing import Any

from gateway.app import serve
from gateway.app.devenv import CLIENT_SCOPES, client_token, client_topics
from gateway.app.process import Service
from gateway.app.worker import service as pipeline_service
from gateway.config import Secret, Settings, parse_webhook_secrets, redact_url
from gateway.stores import devstack, embedded
from gateway.stores.migrate import migrate_url

# CLIENT_SCOPES and client_topics: the dev client token's, for tests that mint its like.
__all__ = ["CLIENT_SCOPES", "client_topics", "main", "start_stack"]
UNIX_PATH_MAX = 100  # sun_path is 108 bytes; leave room


def _load_secrets(path: Path) -> dict[str, str]:
    data: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    changed = False
    for name in ("durable_password", "cache_password", "postgres_password", "admin_token",
                 "jwt_secret"):
        if name not in data:
            data[name] = embedded.new_password()
            changed = True
    if "webhook_secret" not in data:
        data["webhook_secret"] = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
        changed = True
    if changed:
        path.write_text(json.dumps(data, indent=2))
        path.chmod(0o600)
    return data


def _redis(role: embedded.Role, root: Path, password: str,
           binary: str | None = None) -> embedded.RedisServer:
    sock = root / f"{role}.sock"
    server = embedded.RedisServer(role, root / role, password,
                                  unix_socket=sock if len(str(sock)) < UNIX_PATH_MAX else None,
                                  binary=binary or embedded.find_redis_server())
    return server.start()


def start_stack(root: Path, settings: Settings) -> tuple[Settings, list[Any], dict[str, str]]:
    """Start what the settings do not point at; return settings that point at everything."""
    root.mkdir(parents=True, exist_ok=True)
    found = _load_secrets(root / "secrets.json")
    servers: list[Any] = []
    changes: dict[str, Any] = {}
    try:
        if not settings.durable_url:
            # WAITAOF (GATEWAY_DURABLE_ACK=aof) needs Valkey or Redis 7.2+: take Valkey then.
            server = _redis("durable", root, found["durable_password"],
                            embedded.find_valkey_server()
                            if settings.durable_ack == "aof" else None)
            servers.append(server)
            changes["durable_url"] = server.url
        if not settings.cache_url:
            server = _redis("cache", root, found["cache_password"])
            servers.append(server)
            changes["cache_url"] = server.url
        if not settings.database_url:
            pg = embedded.PostgresServer(root / "postgres" / "data",
                                         password=found["postgres_password"]).start()
            servers.append(pg)
            changes["database_url"] = pg.url
    except BaseException:
        embedded.stop_all(servers)
        raise
    if not settings.admin_token:
        changes["admin_token"] = Secret(found["admin_token"])
    if not settings.jwt_secret:
        changes["jwt_secret"] = Secret(found["jwt_secret"])
    if not settings.webhook_sources:
        changes["webhook_sources"] = parse_webhook_secrets(
            "GATEWAY_WEBHOOK_SECRETS", f"demo={found['webhook_secret']}")
    changes["dev"] = True  # loopback clients are never locked out by the barrier
    return dataclasses.replace(settings, **changes), servers, found


def _announce(url: str, settings: Settings, root: Path) -> None:
    devstack.write(root, settings, url)  # before the banner: the CLI can use it at once
    lines = [
        f"gateway dev: serving on {url}  (dashboard {url}/, readiness {url}/readyz)",
        f"  GATEWAY_DURABLE_URL={redact_url(settings.durable_url)}",
        f"  GATEWAY_CACHE_URL={redact_url(settings.cache_url)}",
        f"  GATEWAY_DATABASE_URL={redact_url(settings.database_url)}",
        f"  passwords, admin token, JWT secret, demo webhook secret (source 'demo'): "
        f"{root / 'secrets.json'}",
        "  every gateway command run in this folder uses this stack; in another shell:",
        f"export {devstack.DIR_VARIABLE}={shlex.quote(str(root))}",
        "  Ctrl-C stops everything.",
    ]
    assert settings.admin_token and settings.jwt_secret
    # What a newcomer needs to call every route (README shows how): the operator's token,
    # and an access token for an app.
    lines += [f"admin token: {settings.admin_token.get()}",
              f"client token: {client_token(settings)}"]
    print("\n".join(lines), flush=True)


def _services(args: argparse.Namespace) -> list[Service]:
    return [] if args.no_workers else [pipeline_service(concurrency=args.concurrency)]


def main(args: argparse.Namespace, settings: Settings) -> int:
    root = Path(args.data_dir).resolve()
    try:
        held = devstack.lock(root)  # held until this process ends
    except devstack.StackRunning as exc:
        print(f"gateway dev: {exc}", file=sys.stderr)
        return 1
    try:
        settings, servers, _ = start_stack(root, settings)
    except embedded.EmbeddedError as exc:
        print(f"gateway dev: {exc}", file=sys.stderr)
        held.close()
        return 1
    try:
        assert settings.database_url
        asyncio.run(migrate_url(settings.database_url))
        return asyncio.run(serve.run(settings, services=_services(args),
                                     on_ready=lambda url: _announce(url, settings, root)))
    except KeyboardInterrupt:
        return 130
    finally:
        devstack.forget(root)
        embedded.stop_all(servers)
        held.close()
