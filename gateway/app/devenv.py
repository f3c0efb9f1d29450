"""``gateway env`` and the dev client token: apart from ``gateway.app.dev`` so that
``eval "$(gateway env)"`` imports what it needs (tokens), not the whole server."""

from __future__ import annotations

import argparse
import os
import shlex

from gateway import keys
from gateway.access import tokens
from gateway.config import ConfigError, Settings
from gateway.pipeline.stages import progress_topic
from gateway.stores import devstack

CLIENT_SUB = "dev-client"
CLIENT_SCOPES = frozenset({"jobs:write", "jobs:read", "search:read", "feed:read"})
CLIENT_TTL = 86400


def client_topics(sub: str) -> tuple[str, ...]:
    """The dev client token's topics: the progress of its own jobs
    (``pipeline:<its namespace>``) and the conversations."""
    return (progress_topic(keys.owner_namespace(sub)), "conversation:*")


def client_token(settings: Settings) -> str:
    """An access token for an app (a day long, or the longest ``[access]`` allows; its own
    jobs' progress and every conversation; not the operators' ``pipeline``, which names
    every tenant's items)."""
    assert settings.jwt_secret
    return tokens.mint(settings.jwt_secret.get(), CLIENT_SUB, CLIENT_SCOPES,
                       client_topics(CLIENT_SUB),
                       min(CLIENT_TTL, tokens.max_token_seconds(settings)),
                       issuer=settings.jwt_issuer, audience=settings.jwt_audience)


def main_env(args: argparse.Namespace, settings: Settings) -> int:
    """``gateway env``: shell lines that give this shell what the README's examples use,
    from the running dev stack: ``eval "$(gateway env)"``."""
    root, url = devstack.running_url(os.environ)
    if url is None:
        raise ConfigError(devstack.DIR_VARIABLE, f"no running gateway dev stack in {root} (start "
                          "`gateway dev` in this folder, or point GATEWAY_DEV_DIR at its "
                          ".gateway folder)")
    assert settings.admin_token
    demo = settings.webhook_sources.get("demo")
    lines = [f"export {devstack.DIR_VARIABLE}={shlex.quote(str(root))}",
             f"export GATEWAY_URL={shlex.quote(url)}",
             f"export GATEWAY_ADMIN_TOKEN={shlex.quote(settings.admin_token.get())}",
             'ADMIN="$GATEWAY_ADMIN_TOKEN"',
             f"TOKEN={shlex.quote(client_token(settings))}"]
    if demo is not None:
        lines.append(f"SECRET={shlex.quote(demo.secret.get())}")
    print("\n".join(lines))
    return 0
