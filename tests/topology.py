"""Redis topologies beyond one instance, for the test fixtures: a local three-master Redis
Cluster per role, and a Sentinel-watched master/replica pair.

Every node is a :class:`gateway.stores.embedded.RedisServer` started with the role's
``deploy/redis/*.conf`` plus the overrides that make it a cluster node or a replica, so the
cluster runs the same memory and persistence policy as the single instance it replaces.

``GATEWAY_TEST_TOPOLOGY=cluster`` makes the session ``servers`` fixture use clusters
(tests/conftest.py); the sentinel pair is started only by the tests that need it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

from gateway.stores import embedded

TOPOLOGY_ENV = "GATEWAY_TEST_TOPOLOGY"
TOPOLOGIES = ("single", "cluster")


def topology() -> str:
    """The topology the session runs on: ``single`` (default) or ``cluster``."""
    value = os.environ.get(TOPOLOGY_ENV, "single").strip().lower() or "single"
    if value not in TOPOLOGIES:
        raise ValueError(f"{TOPOLOGY_ENV} must be one of {', '.join(TOPOLOGIES)}, not {value!r}")
    return value


def is_cluster_run() -> bool:
    return topology() == "cluster"


def _redis_cli() -> str:
    """redis-cli on PATH, else the valkey-cli beside the embedded valkey-server."""
    found = shutil.which("redis-cli") or shutil.which("valkey-cli")
    if not found:
        beside = Path(embedded.find_redis_server()).with_name("valkey-cli")
        found = str(beside) if beside.exists() else None
    if not found:
        raise embedded.EmbeddedError("redis-cli (or valkey-cli) is needed to create a cluster")
    return found


def command(port: int, password: str, *args: str, timeout: float = 2.0) -> Any:
    """One command to one node, reply as redis-py parses it (INFO gives a dict): used while a
    cluster forms or a failover runs, where the clients under test must not be the probe."""
    with redis.Redis(port=port, password=password or None, socket_timeout=timeout,
                     socket_connect_timeout=timeout, decode_responses=True) as conn:
        return conn.execute_command(*args)


@dataclass
class LocalCluster:
    """Three (or more) masters, no replicas, one role's configuration on every node."""

    role: embedded.Role
    root: Path
    password: str
    masters: int = 3
    nodes: list[embedded.RedisServer] = field(default_factory=list)
    binary: str = field(default_factory=embedded.find_redis_server)

    @property
    def url(self) -> str:
        first = self.nodes[0]
        return f"redis+cluster://:{quote(self.password, safe='')}@127.0.0.1:{first.port}/"

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def start(self, timeout: float = 30.0) -> LocalCluster:
        try:
            for index in range(self.masters):
                node = embedded.RedisServer(
                    self.role, self.root / f"{self.role}-{index}", self.password,
                    overrides={
                        "cluster-enabled": "yes",
                        # The bus port is explicit: port+10000 may be taken or above 65535.
                        "cluster-port": str(embedded.free_port()),
                        "cluster-config-file": "nodes.conf",
                        "cluster-node-timeout": "5000",
                        # A test cluster has no replicas: keep answering for the slots we have.
                        "cluster-require-full-coverage": "no",
                    }, binary=self.binary)
                self.nodes.append(node.start())
            self._create(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self, timeout: float) -> None:
        args = [_redis_cli(), "--cluster", "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas", "0", "--cluster-yes"]
        env = {**os.environ, "REDISCLI_AUTH": self.password}  # keeps it off the command line
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                                stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise embedded.EmbeddedError(
                f"redis-cli --cluster create failed: {result.stdout[-1500:]}{result.stderr}")
        embedded.wait_until(self.healthy, timeout, f"{self.role} cluster state ok")

    def healthy(self) -> bool:
        """Every node says cluster_state:ok and knows every other node."""
        for port in self.ports:
            try:
                info = str(command(port, self.password, "CLUSTER", "INFO"))
            except OSError:
                return False
            if ("cluster_state:ok" not in info
                    or f"cluster_known_nodes:{self.masters}" not in info):
                return False
        return True

    def stop(self) -> None:
        embedded.stop_all(self.nodes)


@dataclass
class SentinelSet:
    """A master, one replica and one sentinel watching them under ``service``.

    One sentinel with quorum 1 is enough to test client discovery and a ``SENTINEL FAILOVER``
    (which needs no quorum); production runs three or more on separate hosts.
    """

    root: Path
    password: str
    service: str = "gateway-durable"
    role: embedded.Role = "durable"
    # False: the sentinel has no password, and the URL says so with ``sentinel_password=``.
    sentinel_auth: bool = True
    master: embedded.RedisServer | None = None
    replica: embedded.RedisServer | None = None
    sentinel_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        query = "" if self.sentinel_auth else "?sentinel_password="
        return (f"redis+sentinel://:{quote(self.password, safe='')}@"
                f"127.0.0.1:{self.sentinel_port}/{self.service}{query}")

    @property
    def _sentinel_password(self) -> str:
        return self.password if self.sentinel_auth else ""

    @property
    def servers(self) -> Sequence[embedded.RedisServer]:
        return [s for s in (self.master, self.replica) if s is not None]

    def start(self, timeout: float = 30.0) -> SentinelSet:
        try:
            self.master = embedded.RedisServer(
                self.role, self.root / "master", self.password,
                overrides={"masterauth": self.password}).start()
            self.replica = embedded.RedisServer(
                self.role, self.root / "replica", self.password,
                overrides={"masterauth": self.password,
                           "replicaof": f"127.0.0.1 {self.master.port}"}).start()
            embedded.wait_until(self._replica_synced, timeout, "replica in sync")
            self._start_sentinel(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _replica_synced(self) -> bool:
        assert self.replica is not None
        info = command(self.replica.port, self.password, "INFO", "replication")
        return bool(info.get("master_link_status") == "up")

    def _start_sentinel(self, timeout: float) -> None:
        assert self.master is not None
        directory = self.root / "sentinel"
        directory.mkdir(parents=True, exist_ok=True)
        self.sentinel_port = embedded.free_port()
        conf = directory / "sentinel.conf"
        # Sentinel rewrites its file at run time, so it is generated, never a checked-in file.
        conf.write_text("\n".join([
            "bind 127.0.0.1",
            f"port {self.sentinel_port}",
            f"dir {directory}",
            f"requirepass {self._sentinel_password}" if self.sentinel_auth else "",
            f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 1",
            f"sentinel auth-pass {self.service} {self.password}",
            f"sentinel down-after-milliseconds {self.service} 2000",
            f"sentinel failover-timeout {self.service} 2000",
            "",
        ]))
        log = directory / "sentinel.log"
        self.proc = subprocess.Popen(
            [self.master.binary, str(conf), "--sentinel", "--logfile", str(log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            preexec_fn=embedded._die_with_parent,
        )
        embedded.wait_until(self._sentinel_sees_replica, timeout, "sentinel", self.proc, log)

    def _sentinel_sees_replica(self) -> bool:
        """The sentinel knows the replica and talks to it: a failover can then promote it."""
        assert self.replica is not None
        try:
            replicas = self.sentinel("REPLICAS", self.service)
        except (OSError, redis.RedisError):
            return False
        return any(int(r.get("port", 0)) == self.replica.port
                   and not {"disconnected", "s_down"} & set(r.get("flags", "").split(","))
                   for r in replicas)

    def master_port(self) -> int:
        """The master's port as the sentinel reports it now."""
        return int(self.sentinel("GET-MASTER-ADDR-BY-NAME", self.service)[1])

    def sentinel(self, *args: str) -> Any:
        return command(self.sentinel_port, self._sentinel_password, "SENTINEL", *args)

    def stop(self) -> None:
        embedded._terminate(self.proc, 15, 10.0)
        self.proc = None
        embedded.stop_all(self.servers)


Started = tuple[str, embedded.RedisServer | None, embedded.RedisServer | LocalCluster]


def start_redis(role: embedded.Role, directory: Path) -> Started:
    """One role's Redis for the session, on the topology ``GATEWAY_TEST_TOPOLOGY`` names:
    ``(url, single server or None, what to stop)``."""
    password = embedded.new_password()
    if is_cluster_run():
        cluster = LocalCluster(role, directory, password).start()
        return cluster.url, None, cluster
    server = embedded.RedisServer(role, directory, password).start()
    return server.url, server, server


def discard(running: Sequence[Any]) -> None:
    """Stop servers whose data is thrown away with them (the session's, at its end): Redis by
    SIGKILL, PostgreSQL by an immediate shutdown (SIGQUIT), skipping the shutdown save and the
    checkpoint of everything the session wrote (10-17 s at the end of a loaded run, with a
    worker's last test waiting on it)."""
    for server in reversed(running):
        with contextlib.suppress(Exception):
            _discard(server)


def _discard(server: Any) -> None:
    if isinstance(server, LocalCluster):
        discard(server.nodes)
    elif isinstance(server, embedded.RedisServer):
        server.kill()
    elif isinstance(server, embedded.PostgresServer):
        embedded._terminate(server.proc, signal.SIGQUIT, 10.0)
        server.proc = None
    else:
        server.stop()
