"""One line, never a traceback, for every operator mistake of issue 28: a busy port, a log
level that does not exist, a store that cannot be reached or refuses the password (from
any command that uses it, naming the store and the reason, never the password), a missing
body file for ``gateway sign``; ``doctor`` names the reason too."""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gateway import cli
from gateway.stores.embedded import free_port
from tests.conftest import ServerSet

pytestmark = pytest.mark.single_instance  # rewrites single-instance URLs (wrong password)


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


Run = Callable[..., Done]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Iterator[Run]:
    """``gateway <args>`` as a user runs it in a shell, in this process (an import of the
    whole package per case would cost seconds each): no GATEWAY_* variable but ``env``,
    run in ``cwd``. An exception leaving ``main`` is a traceback, and fails the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def call(cwd: Path, *args: str, **env: str) -> Done:
        with monkeypatch.context() as patched:
            for name in [n for n in os.environ if n.startswith("GATEWAY_")]:
                patched.delenv(name)
            for name, value in env.items():
                patched.setenv(name, value)
            patched.chdir(cwd)
            capsys.readouterr()
            try:
                code = cli.main(list(args))
            except SystemExit as exc:  # what the interpreter prints and exits with
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
                code = 1 if isinstance(exc.code, str) else int(exc.code or 0)
            finally:
                root.handlers[:], root.level = handlers, level  # configure() replaced them
        out = capsys.readouterr()
        return Done(code, out.out, out.err)

    yield call


def _one_line(done: Done) -> str:
    """The run failed with exactly one line on stderr and no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, (done.returncode, done.stderr)
    return lines[0]


@pytest.fixture
def stores(servers: ServerSet) -> dict[str, str]:
    return {"GATEWAY_DURABLE_URL": servers.durable_url, "GATEWAY_CACHE_URL": servers.cache_url,
            "GATEWAY_DATABASE_URL": servers.database_url, "GATEWAY_ADMIN_TOKEN": "t"}


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_busy_port(run: Run, tmp_path: Path, stores: dict[str, str], held_port: int) -> None:
    line = _one_line(run(tmp_path, "serve", **stores, GATEWAY_PORT=str(held_port)))
    assert line.startswith("gateway: configuration error: GATEWAY_PORT: cannot listen on "
                           f"127.0.0.1:{held_port}: "), line
    assert "in use" in line


def test_a_log_level_that_does_not_exist(run: Run, tmp_path: Path) -> None:
    line = _one_line(run(tmp_path, "keys", GATEWAY_LOG_LEVEL="LOUD"))
    assert line == ("gateway: configuration error: GATEWAY_LOG_LEVEL: must be one of DEBUG, "
                    "INFO, WARNING, ERROR, CRITICAL (got 'LOUD')")


# Every command that reads or writes redis-durable.
DURABLE_COMMANDS = [("deadletter", "list", "--stage", "store"), ("barrier", "list"),
                    ("maintenance", "status"), ("recover",)]


@pytest.mark.parametrize("command", DURABLE_COMMANDS, ids=" ".join)
def test_redis_durable_unreachable(run: Run, tmp_path: Path, stores: dict[str, str],
                                   command: tuple[str, ...]) -> None:
    port = free_port()  # nothing listens there
    url = f"redis://:pw-not-shown@127.0.0.1:{port}/0"
    line = _one_line(run(tmp_path, *command, **{**stores, "GATEWAY_DURABLE_URL": url}))
    assert line.startswith(f"gateway: cannot reach redis-durable at "
                           f"redis://:***@127.0.0.1:{port}/0: "), line
    assert "refused" in line.lower() and "pw-not-shown" not in line


@pytest.mark.parametrize("command", DURABLE_COMMANDS[:2], ids=" ".join)
def test_redis_durable_wrong_password(run: Run, tmp_path: Path, stores: dict[str, str],
                                      command: tuple[str, ...]) -> None:
    real = urlsplit(stores["GATEWAY_DURABLE_URL"])
    url = real._replace(netloc=f":wrong-secret-123@{real.hostname}:{real.port}").geturl()
    line = _one_line(run(tmp_path, *command, **{**stores, "GATEWAY_DURABLE_URL": url}))
    assert line.startswith("gateway: cannot reach redis-durable at redis://:***@"), line
    assert "password was refused" in line and "wrong-secret-123" not in line


@pytest.mark.parametrize("command", [("apikey", "list"), ("migrate",)], ids=" ".join)
def test_postgres_unreachable(run: Run, tmp_path: Path, stores: dict[str, str],
                              command: tuple[str, ...]) -> None:
    port = free_port()
    url = f"postgresql://postgres:pg-secret@127.0.0.1:{port}/postgres"
    line = _one_line(run(tmp_path, *command, **{**stores, "GATEWAY_DATABASE_URL": url}))
    assert line.startswith(f"gateway: cannot reach postgres at "
                           f"postgresql://postgres:***@127.0.0.1:{port}/postgres: "), line
    assert "pg-secret" not in line


def test_sign_without_its_body_file(run: Run, tmp_path: Path) -> None:
    line = _one_line(run(tmp_path, "sign", "--secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                          "--id", "msg_1", "body.json"))
    assert line == "gateway sign: cannot read body.json: No such file or directory"


def test_doctor_names_the_reason(run: Run, tmp_path: Path, stores: dict[str, str]) -> None:
    port = free_port()
    done = run(tmp_path, "doctor", **{**stores, "GATEWAY_DURABLE_URL":
                                       f"redis://127.0.0.1:{port}/0"})
    assert done.returncode == 1 and "Traceback" not in done.stderr + done.stdout
    failed = [line for line in done.stdout.splitlines() if line.startswith("fail")]
    assert failed == [f"fail redis-durable: unreachable at redis://127.0.0.1:{port}/0: "
                      f"Connection refused (127.0.0.1:{port})"], \
        done.stdout


def test_serve_with_stores_down_refuses_in_one_line(run: Run, tmp_path: Path,
                                                     stores: dict[str, str]) -> None:
    down = {"GATEWAY_DURABLE_URL": f"redis://127.0.0.1:{free_port()}/0",
            "GATEWAY_CACHE_URL": f"redis://127.0.0.1:{free_port()}/0"}
    line = _one_line(run(tmp_path, "serve", **{**stores, **down}))
    assert line.startswith("gateway: refusing to start: fail redis-durable: unreachable at "
                           f"{down['GATEWAY_DURABLE_URL']}: Connection refused"), line
    assert line.endswith("(and 1 more: `gateway doctor` lists them)")


def test_the_store_that_failed_is_named_first(run: Run, tmp_path: Path,
                                              stores: dict[str, str]) -> None:
    """``apikey list`` reads PostgreSQL only: with PostgreSQL and redis-durable both down,
    the line names PostgreSQL, the store the command needed."""
    down = {"GATEWAY_DURABLE_URL": f"redis://127.0.0.1:{free_port()}/0",
            "GATEWAY_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"}
    line = _one_line(run(tmp_path, "apikey", "list", **{**stores, **down}))
    assert line.startswith("gateway: cannot reach postgres at "), line
    assert line.endswith(": Connection refused")
