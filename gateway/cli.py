"""``gateway`` command line. Subcommands live with the code they drive and are
imported only when used, so ``gateway keys`` does not pay for importing the bot libraries."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from gateway import keys, logging_setup
from gateway.config import ConfigError, Secret, Settings, load_settings
from gateway.pipeline.stages import STAGES
from gateway.providers.config import provider_checks, provider_key_values
from gateway.stores import devstack

# subcommand -> "module:function"; the function takes (args, settings) and returns an exit code.
TARGETS: dict[str, str] = {
    "dev": "gateway.app.dev:main",
    "serve": "gateway.app.serve:main",
    "worker": "gateway.app.worker:main",
    "listen": "gateway.app.listen:main",
    "recover": "gateway.pipeline.reset:main",
    "reembed": "gateway.knowledge.reembed:main",
    "deadletter": "gateway.pipeline.deadletter:main",
    "sign": "gateway.inbound.webhooks:main_sign",
    "telegram": "gateway.inbound.telegram:main_set_webhook",
    "maintenance": "gateway.app.maintenance:main",
    "apikey": "gateway.access.apikeys:main",
    "token": "gateway.access.tokens:main_token",
    "barrier": "gateway.security.blocks:main",
    "env": "gateway.app.devenv:main_env",
}


def _stages(text: str) -> list[str]:
    stages = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise argparse.ArgumentTypeError(f"stages must be among {','.join(STAGES)}")
    return stages


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("dev", help="whole stack locally on embedded servers (data in ./.gateway)")
    p.add_argument("--data-dir", default=".gateway")
    p.add_argument("--no-workers", action="store_true", help="HTTP server only")
    p.add_argument("--concurrency", type=int, default=8)

    p = sub.add_parser("serve", help="HTTP server")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--telegram-polling", action="store_true",
                   help="take Telegram updates by long polling instead of the webhook")
    p.add_argument("--processes", type=int, default=1, metavar="N",
                   help="N serve processes sharing the port (SO_REUSEPORT), each with its "
                        "own hub, under one supervisor (default 1)")
    p.add_argument("--reuse-port", action="store_true",
                   help="bind with SO_REUSEPORT, so other processes may listen on the port too")
    # The supervisor's end of a pipe: one byte once this process listens (internal).
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)

    p = sub.add_parser("worker", help="pipeline workers")
    p.add_argument("--stages", type=_stages, default=list(STAGES),
                   help="comma-separated subset of store,chunk,embed,graph")
    p.add_argument("--concurrency", type=int, default=8)

    p = sub.add_parser("listen", help="platform listeners")
    p.add_argument("platform", choices=["mattermost"])

    sub.add_parser("doctor", help="check the topology; non-zero exit on a failure")
    sub.add_parser("keys", help="print the key registry")
    sub.add_parser("migrate", help="apply pending PostgreSQL migrations")
    p = sub.add_parser("recover", help="re-enqueue from the run journal what Redis lost")
    p.add_argument("--reset", action="store_true",
                   help="after restoring PostgreSQL from a backup (maintenance on): rebuild "
                        "the pipeline's Redis state from the journal")

    sub.add_parser("reembed", help="after the embedder changed: run the embed stage again "
                   "for items whose vectors another embedder made")

    p = sub.add_parser("apikey", help="API keys: create (printed once), list, revoke")
    actions = p.add_subparsers(dest="apikey_action", required=True)
    created = actions.add_parser("create", help="print a new key once, as one JSON object")
    created.add_argument("--name", required=True)
    created.add_argument("--scopes", required=True, help="comma-separated scopes")
    created.add_argument("--topics", default="", help="comma-separated topic patterns")
    created.add_argument("--subs", default="", help="comma-separated patterns of the accounts "
                         "(subs) it may mint tokens for with tokens:issue (default: none)")
    actions.add_parser("list", help="one JSON object per key (never the key itself)")
    actions.add_parser("revoke", help="refused on every replica from the next request"
                       ).add_argument("id")

    sub.add_parser("env", help="shell lines for the running gateway dev stack of this "
                   "folder (the README's ADMIN, TOKEN, SECRET): eval \"$(gateway env)\"")

    p = sub.add_parser("barrier", help="addresses the brute-force barrier blocks: list, "
                       "clear ADDRESS|--all")
    actions = p.add_subparsers(dest="barrier_action", required=True)
    actions.add_parser("list", help="one JSON object per blocked address")
    cleared = actions.add_parser("clear", help="lift one address's block, or every block")
    cleared.add_argument("address", nargs="?", help="an address (IPv6: any in the /64)")
    cleared.add_argument("--all", action="store_true", help="every block")

    p = sub.add_parser("token", help="mint an access token (GATEWAY_JWT_SECRET)")
    p.add_argument("--sub", required=True)
    p.add_argument("--scope", default="feed:read", help="space- or comma-separated scopes")
    p.add_argument("--topics", default="", help="comma-separated topic patterns")
    p.add_argument("--ttl", type=int, default=900, help="seconds")

    p = sub.add_parser("deadletter", help="inspect or act on dead letters")
    p.add_argument("action", choices=["list", "requeue", "purge"])
    p.add_argument("--stage", required=True, choices=STAGES)
    p.add_argument("--limit", type=int, default=100)

    p = sub.add_parser("sign", help="print Standard Webhooks headers for a body")
    p.add_argument("--secret", required=True)
    p.add_argument("--id", required=True, dest="msg_id")
    p.add_argument("--timestamp", type=int)
    p.add_argument("bodyfile")

    p = sub.add_parser("maintenance", help="maintenance mode: inbound refused, workers idle")
    p.add_argument("action", choices=["on", "off", "status"])
    p.add_argument("--reason", default="maintenance")
    p.add_argument("--for", dest="seconds", type=float, default=3600.0,
                   help="seconds until it ends on its own (default 3600)")

    p = sub.add_parser("telegram", help="Telegram helpers")
    tsub = p.add_subparsers(dest="telegram_command", required=True)
    tp = tsub.add_parser("set-webhook", help="register the webhook with TELEGRAM_WEBHOOK_SECRET")
    tp.add_argument("url")
    return parser


def cmd_keys(args: argparse.Namespace, settings: Settings) -> int:
    rows = keys.table()
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(row[i].ljust(widths[i]) for i in range(4)) + "  " + row[4])
    return 0


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.stores import doctor
    checks = asyncio.run(doctor.run_checks(settings)) + provider_checks(settings)
    for check in checks:
        print(check.line())
    return 1 if doctor.has_failure(checks) else 0


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.stores.migrate import migrate_url

    if not settings.database_url:
        raise ConfigError("GATEWAY_DATABASE_URL", "is required")
    applied = asyncio.run(migrate_url(settings.database_url))
    for m in applied:
        print(f"applied {m.version:04d}_{m.name}")
    if not applied:
        print("schema current")
    return 0


LOCAL: dict[str, Callable[[argparse.Namespace, Settings], int]] = {
    "keys": cmd_keys, "doctor": cmd_doctor, "migrate": cmd_migrate,
}


def _resolve(command: str) -> Callable[[argparse.Namespace, Settings], int]:
    if command in LOCAL:
        return LOCAL[command]
    module_name, _, function = TARGETS[command].partition(":")
    return getattr(importlib.import_module(module_name), function)


def main(argv: Sequence[str] | None = None) -> int:
    """Every operator mistake ends in one line on stderr, never a traceback: a wrong setting
    (exit 2), a store that cannot be reached (naming it and why) or any other refusal of
    the system (exit 1). ``GATEWAY_LOG_LEVEL=DEBUG`` shows the traceback as well."""
    args = build_parser().parse_args(argv)
    settings: Settings | None = None
    try:
        settings = load_settings()
        if args.command != "dev":  # the stack of `gateway dev` in this folder, if any
            settings = devstack.apply(settings, os.environ)
        level = os.environ.get("GATEWAY_LOG_LEVEL") or "INFO"
        if not logging_setup.is_level(level):
            raise ConfigError("GATEWAY_LOG_LEVEL", f"must be one of "
                              f"{', '.join(logging_setup.LEVELS)} (got {level[:40]!r})")
        logging_setup.configure(_secret_values(settings), level)
        return _resolve(args.command)(args, settings)
    except ConfigError as exc:
        print(f"gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from gateway.stores import reach

        if settings is None or not reach.is_store_error(exc):
            raise
        lines = asyncio.run(reach.unreachable(settings, exc)) or [
            reach.scrub(f"{args.command}: {reach.reason(exc)}", settings)]
        if os.environ.get("GATEWAY_LOG_LEVEL", "").upper() == "DEBUG":
            raise
        # One line: the first store that fails (durable, cache, PostgreSQL) is the one to fix.
        print(f"gateway: {lines[0]}", file=sys.stderr)
        return 1


def _secret_values(settings: Settings) -> list[str]:
    values = [v.get() for v in vars(settings).values() if isinstance(v, Secret)]
    values += [src.secret.get() for src in settings.webhook_sources.values()]
    values += provider_key_values(settings)
    for url in (settings.durable_url, settings.cache_url, settings.database_url):
        if url and "@" in url and ":" in url.split("@")[0].split("//")[-1]:
            values.append(url.split("@")[0].split("//")[-1].split(":", 1)[1])
    return values


if __name__ == "__main__":
    raise SystemExit(main())
