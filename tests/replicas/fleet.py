"""Real ``gateway serve`` and ``gateway worker`` subprocesses on the session's stores,
pointed at the fake platforms, with short lease timings: the replica test's fleet."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from gateway.stores import embedded
from tests.conftest import TEST_ADMIN_TOKEN, TEST_WEBHOOK_SOURCES, ServerSet
from tests.fakes import FakeSlack, FakeTelegram
from tests.fakes.pytest_plugin import SLACK_TOKEN, TELEGRAM_TOKEN
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
TELEGRAM_SECRET = "replica-telegram-secret"
SLACK_SIGNING_SECRET = "replica-slack-signing-secret"
# Whole seconds (the variables are integers): a live worker beats 4 times per lease, so only
# a dead one loses its leases; RECLAIM then runs every second in each replica and worker.
TIMINGS = {"GATEWAY_LEASE_SECONDS": "4", "GATEWAY_HEARTBEAT_SECONDS": "1",
           "GATEWAY_RECLAIM_SECONDS": "1"}
CONFIG = """
[pipeline]
backoff_seconds = 0.05
backoff_cap_seconds = 0.2
shutdown_grace_seconds = 2

[pipeline.handlers]
chunk = "tests.replicas.handlers:slow_chunk"
"""
Process = asyncio.subprocess.Process


def fleet_env(servers: ServerSet, telegram: FakeTelegram, slack: FakeSlack,
              directory: Path, extra_config: str = "") -> dict[str, str]:
    """The environment every process of the fleet shares (each serve adds its port)."""
    config = directory / "gateway.toml"
    config.write_text(CONFIG + extra_config)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GATEWAY_", "MATTERMOST_", "TELEGRAM_", "SLACK_"))}
    env.update(TIMINGS)
    env.update({
        "GATEWAY_DURABLE_URL": servers.durable_url,
        "GATEWAY_CACHE_URL": servers.cache_url,
        "GATEWAY_DATABASE_URL": servers.database_url,
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_ADMIN_TOKEN": TEST_ADMIN_TOKEN,
        "GATEWAY_WEBHOOK_SECRETS": TEST_WEBHOOK_SOURCES,
        "GATEWAY_CONFIG": str(config),
        "TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN,
        "TELEGRAM_WEBHOOK_SECRET": TELEGRAM_SECRET,
        "TELEGRAM_API_URL": telegram.api_url,
        "SLACK_BOT_TOKEN": SLACK_TOKEN,
        "SLACK_SIGNING_SECRET": SLACK_SIGNING_SECRET,
        "SLACK_API_URL": slack.api_url,
    })
    return env


@dataclass
class Fleet:
    """Processes started here are killed at the end, whatever happens."""

    env: dict[str, str]
    logs: Path
    servers: list[tuple[Process, str]] = field(default_factory=list)
    workers: list[Process] = field(default_factory=list)

    async def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> Process:
        with (self.logs / f"{name}.log").open("wb") as out:
            return await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway.cli", *args, cwd=ROOT, env=env,
                stdout=out, stderr=asyncio.subprocess.STDOUT)

    async def start(self, serves: int, workers: int, concurrency: int = 2) -> None:
        for n in range(serves):
            port = embedded.free_port()
            proc = await self._spawn(f"serve{n}", ["serve"],
                                     {**self.env, "GATEWAY_PORT": str(port)})
            self.servers.append((proc, f"http://127.0.0.1:{port}"))
        for n in range(workers):
            self.workers.append(await self._spawn(
                f"worker{n}", ["worker", "--concurrency", str(concurrency)], self.env))

    async def restart_server(self, index: int, name: str) -> float:
        """SIGTERM one serve, wait for it to exit, start a new one on the same port; the
        seconds the old one took to stop."""
        proc, url = self.servers[index]
        started = asyncio.get_running_loop().time()
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
        took = asyncio.get_running_loop().time() - started
        port = url.rsplit(":", 1)[1]
        new = await self._spawn(name, ["serve"], {**self.env, "GATEWAY_PORT": port})
        self.servers[index] = (new, url)
        return took

    async def restart_worker(self, index: int, name: str, concurrency: int = 2) -> float:
        """SIGTERM one worker, wait for it to exit, start a new one; the seconds it took."""
        proc = self.workers[index]
        started = asyncio.get_running_loop().time()
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
        took = asyncio.get_running_loop().time() - started
        self.workers[index] = await self._spawn(
            name, ["worker", "--concurrency", str(concurrency)], self.env)
        return took

    def url(self) -> str:
        """A random replica, as a load balancer would pick one."""
        return random.choice(self.servers)[1]

    async def wait_ready(self, http: aiohttp.ClientSession, timeout: float = 40) -> None:
        """Every replica answers /readyz 200 with its Telegram bot ready."""
        async def ready(url: str) -> bool:
            try:
                async with http.get(f"{url}/readyz") as response:
                    body = await response.json()
            except aiohttp.ClientError:
                return False
            return response.status == 200 and bool(body["checks"]["telegram"]["ok"])

        async def all_ready() -> bool:
            self.check_alive()
            return all(await asyncio.gather(*(ready(url) for _, url in self.servers)))

        await wait_until(all_ready, timeout=timeout, message="every replica ready")

    async def kill_all(self) -> list[Process]:
        """``kill -9`` every process of the fleet at once; they are forgotten (``start``
        brings up new ones)."""
        procs = [p for p, _ in self.servers] + self.workers
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
        for proc in procs:
            await proc.wait()
        self.servers, self.workers = [], []
        return procs

    def check_alive(self, *killed: Process) -> None:
        """Fail at once (pointing at the logs) when a process the test did not kill died."""
        for proc in [p for p, _ in self.servers] + self.workers:
            if proc.returncode is not None and proc not in killed:
                raise AssertionError(f"pid {proc.pid} exited with {proc.returncode}; "
                                     f"see the logs in {self.logs}")

    async def close(self) -> None:
        procs = [p for p, _ in self.servers] + self.workers
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
