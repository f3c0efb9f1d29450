"""`gateway dev` on a machine with nothing configured: ready within 30 s, Ctrl-C leaves no
process behind and prints no traceback, and a second run reuses the data (AOF and database
survive)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
import redis

from gateway.stores.embedded import free_port

pytestmark = pytest.mark.slow


def _env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GATEWAY_", "TELEGRAM_", "SLACK_", "MATTERMOST_"))}
    env["GATEWAY_PORT"] = str(port)
    return env


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _status(url: str, token: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _processes_using(path: Path) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(path) in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def _run_dev(workdir: Path, port: int) -> tuple[subprocess.Popen[str], str]:
    # Its own process group, as a shell gives a foreground command: Ctrl-C goes to the group.
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "dev"], cwd=workdir,
                            env=_env(port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    while not _ready(url):
        if proc.poll() is not None:
            raise AssertionError(f"gateway dev exited {proc.returncode}: {proc.stdout.read()}")  # type: ignore[union-attr]
        assert time.monotonic() - started < 30, "gateway dev not ready within 30 s"
        time.sleep(0.1)
    return proc, url


def _stop(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C in the terminal: SIGINT to every process of the foreground group, so to any
    server still in gateway dev's group too (stopped under the app's feet, its pool logged
    a traceback per lost connection)."""
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode in (0, 130), out
    assert "Traceback" not in out, out
    return out


def _durable(root: Path) -> redis.Redis:
    secrets = json.loads((root / "secrets.json").read_text())
    return redis.Redis(unix_socket_path=str(root / "durable.sock"),
                       password=secrets["durable_password"], decode_responses=True)


def _installation_id(root: Path) -> str:
    port = (root / "postgres" / "data" / "postmaster.pid").read_text().splitlines()[3]
    password = json.loads((root / "secrets.json").read_text())["postgres_password"]
    url = f"postgresql://postgres:{password}@127.0.0.1:{port}/postgres"  # it has one now
    result = subprocess.run(
        [sys.executable, "-c",
         "import asyncio, asyncpg, sys\n"
         "async def m():\n"
         f"    c = await asyncpg.connect({url!r})\n"
         "    print(await c.fetchval('SELECT instance_id FROM gateway_installation'))\n"
         "asyncio.run(m())"], capture_output=True, text=True, check=True, timeout=30)
    return result.stdout.strip()


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Not under pytest's basetemp: pytest resets its root to mode 0700 whenever a session
    # starts, which would lock the unprivileged PostgreSQL user out mid-test.
    path = Path(tempfile.mkdtemp(prefix="gwdev-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_dev_starts_stops_clean_and_reuses_data(workdir: Path) -> None:
    tmp_path = workdir
    root = tmp_path / ".gateway"
    proc, _url = _run_dev(tmp_path, free_port())
    try:
        client = _durable(root)
        client.set("q:{pipeline}:dev-test-marker", "kept")
        client.close()
        installation = _installation_id(root)
    finally:
        out = _stop(proc)
    assert "serving on" in out
    assert re.search(r"GATEWAY_DATABASE_URL=postgresql://", out)
    stored = json.loads((root / "secrets.json").read_text())
    # The tokens a newcomer needs are printed; passwords and signing secrets are not.
    assert f"admin token: {stored['admin_token']}" in out
    client_token = re.search(r"^client token: (\S+)$", out, re.MULTILINE)
    assert client_token is not None
    claims = jwt.decode(client_token.group(1), stored["jwt_secret"], algorithms=["HS256"])
    assert {"feed:read", "jobs:write"} <= set(claims["scope"].split())
    assert not any(value in out for name, value in stored.items() if name != "admin_token")
    deadline = time.monotonic() + 10
    while _processes_using(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_using(root) == []

    proc, _url = _run_dev(tmp_path, free_port())
    try:
        client = _durable(root)
        assert client.get("q:{pipeline}:dev-test-marker") == "kept"
        client.close()
        assert _installation_id(root) == installation
    finally:
        _stop(proc)
    assert _processes_using(root) == []


def _gateway(workdir: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """A ``gateway`` command as a user types it in a shell: no GATEWAY_* variables."""
    env = {**_env(0), **extra}
    env.pop("GATEWAY_PORT")
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=60)


def test_dev_is_the_clis_default_stack_and_a_second_dev_refuses(workdir: Path) -> None:
    """Issue 28 point 2: while ``gateway dev`` runs, every command run in its folder (or with
    the banner's ``export GATEWAY_DEV_DIR=...`` elsewhere) reaches its stack with no
    variable set; ``stack.json`` is the owner's only; a second ``gateway dev`` in the folder
    refuses in one line and leaves the first one's servers and files alone."""
    root = workdir / ".gateway"
    proc, url = _run_dev(workdir, free_port())
    try:
        stack = root / "stack.json"
        assert stack.stat().st_mode & 0o777 == 0o600
        before = {p.name: p.stat().st_mtime_ns for p in root.iterdir()}
        sockets = {p.name: p.stat().st_ino for p in root.glob("*.sock")}
        assert sockets, "the dev stack listens on unix sockets"
        second = subprocess.run([sys.executable, "-m", "gateway.cli", "dev"], cwd=workdir,
                                env=_env(free_port()), capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 1
        assert second.stderr.strip().count("\n") == 0, second.stderr
        assert second.stderr.startswith(f"gateway dev: a stack is already running in {root}")
        assert {p.name: p.stat().st_mtime_ns for p in root.iterdir()} == before
        assert {p.name: p.stat().st_ino for p in root.glob("*.sock")} == sockets
        assert _durable(root).ping()
        assert _ready(url)
        # Issue 28 point 1: a dozen wrong credentials from this machine (the barrier's limit
        # is 10) lock nobody out of their own dev stack: each is a 401, the admin token works.
        statuses = [_status(url + "/v1/admin/queues", "wrong") for _ in range(12)]
        assert statuses == [401] * 12
        admin = json.loads(stack.read_text())["admin_token"]
        assert _status(url + "/v1/admin/queues", admin) == 200
        # Commands in the folder reach the stack with nothing set.
        done = _gateway(workdir, "deadletter", "list", "--stage", "store")
        assert done.returncode == 0, done.stderr
        doctor = _gateway(workdir, "doctor")
        assert "ok   redis-durable: reachable" in doctor.stdout, doctor.stdout
        # Another folder, after the banner's export line.
        elsewhere = workdir / "elsewhere"
        elsewhere.mkdir()
        done = _gateway(elsewhere, "barrier", "list", GATEWAY_DEV_DIR=str(root))
        assert done.returncode == 0, done.stderr
        # `gateway env` gives a shell the README's variables; the admin token works.
        shell = subprocess.run(
            ["bash", "-c", f'eval "$({sys.executable} -m gateway.cli env)" && '
             'curl -s -o /dev/null -w "%{http_code}" -H "Authorization: Bearer $ADMIN" '
             '"$GATEWAY_URL/v1/admin/queues" && test -n "$TOKEN" && test -n "$SECRET"'],
            cwd=workdir, env={k: v for k, v in _env(0).items() if k != "GATEWAY_PORT"},
            capture_output=True, text=True, timeout=60)
        assert (shell.returncode, shell.stdout) == (0, "200"), shell.stderr
    finally:
        out = _stop(proc)
    assert f"export GATEWAY_DEV_DIR={root}" in out.splitlines()
    assert not (root / "stack.json").exists()  # stopped: nothing points at dead servers
