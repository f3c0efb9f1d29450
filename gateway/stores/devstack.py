"""The ``gateway dev`` stack (``gateway.app.dev``) as the CLI's default: what other commands
need to reach it.

``gateway dev`` writes ``<data dir>/stack.json`` (mode 0600: it holds the stores' passwords
and the tokens' secrets) once it serves: its pid, URL, the three store URLs, the admin token,
the JWT secret and the demo webhook source. Every other command run in that folder (or with
``GATEWAY_DEV_DIR`` naming the data dir, the banner's ``export`` line) fills from it what
its settings lack, unless a store URL is set: then the user chose their own servers and the
stack is left out entirely. A stack whose process is gone gives its secrets but not its
store URLs, so a command says a URL is missing rather than failing to connect.

``dev.lock`` beside it is held (``flock``) for the life of a ``gateway dev``: a second one
in the same folder refuses before it touches anything (it would start servers on the first
one's unix sockets).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from pathlib import Path
from typing import IO, Any

from gateway.config import Secret, Settings, parse_webhook_secrets

DEFAULT_DIR = ".gateway"
DIR_VARIABLE = "GATEWAY_DEV_DIR"
STACK_FILE = "stack.json"
LOCK_FILE = "dev.lock"


class StackRunning(Exception):
    """Another ``gateway dev`` holds this data dir; the message says which."""


def lock(root: Path) -> IO[str]:
    """Hold the data dir for this process (released when it exits, however it exits).
    Raises ``StackRunning`` when another process holds it; creates nothing but the lock
    file's folder and the lock file."""
    root.mkdir(parents=True, exist_ok=True)
    handle = (root / LOCK_FILE).open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        found = _read(root) or {}
        where = f" (pid {found['pid']}, {found['url']})" if "pid" in found else ""
        raise StackRunning(f"a stack is already running in {root}{where}; stop it first, "
                           "or run this one in another folder (--data-dir)") from None
    return handle


def write(root: Path, settings: Settings, url: str) -> None:
    """What the CLI needs to reach this stack, readable by its owner only."""
    assert settings.admin_token and settings.jwt_secret
    data = {
        "pid": os.getpid(), "url": url,
        "durable_url": settings.durable_url, "cache_url": settings.cache_url,
        "database_url": settings.database_url,
        "admin_token": settings.admin_token.get(), "jwt_secret": settings.jwt_secret.get(),
        "webhook_secrets": ",".join(f"{s.name}={s.scheme}:{s.secret.get()}"
                                    for s in settings.webhook_sources.values()),
    }
    path = root / STACK_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        json.dump(data, out, indent=2)


def forget(root: Path) -> None:
    """The stack stopped: its store URLs lead nowhere now."""
    with contextlib.suppress(OSError):
        (root / STACK_FILE).unlink()


def stack_dir(environ: dict[str, str] | os._Environ[str]) -> Path:
    return Path(environ.get(DIR_VARIABLE) or DEFAULT_DIR).resolve()


def _read(root: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((root / STACK_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def apply(settings: Settings, environ: dict[str, str] | os._Environ[str]) -> Settings:
    """``settings`` with what they lack taken from the dev stack of this folder (or of
    ``GATEWAY_DEV_DIR``); unchanged when a store URL is set or there is no stack."""
    if settings.durable_url or settings.cache_url or settings.database_url:
        return settings
    root = stack_dir(environ)
    found = _read(root)
    if found is None:
        return settings
    changes: dict[str, Any] = {}
    if _alive(found.get("pid")):
        changes.update({name: found.get(name) for name in
                        ("durable_url", "cache_url", "database_url")})
    if not settings.admin_token and found.get("admin_token"):
        changes["admin_token"] = Secret(str(found["admin_token"]))
    if not settings.jwt_secret and found.get("jwt_secret"):
        changes["jwt_secret"] = Secret(str(found["jwt_secret"]))
    if not settings.webhook_sources and found.get("webhook_secrets"):
        changes["webhook_sources"] = parse_webhook_secrets(
            f"{root / STACK_FILE} webhook_secrets", str(found["webhook_secrets"]))
    return dataclasses.replace(settings, **changes)


def running_url(environ: dict[str, str] | os._Environ[str]) -> tuple[Path, str | None]:
    """The dev stack's data dir and its URL while it runs (else None)."""
    root = stack_dir(environ)
    found = _read(root) or {}
    return root, (str(found["url"]) if _alive(found.get("pid")) and "url" in found else None)
