"""`gateway serve` runs the doctor's checks first and refuses to serve on a failure."""

import os
import subprocess
import sys
from collections.abc import Callable

from gateway.stores.embedded import RedisServer
from tests.conftest import ServerSet


def test_serve_refuses_an_evicting_durable_instance(
        servers: ServerSet, redis_factory: Callable[..., RedisServer]) -> None:
    evicting = redis_factory("durable", **{"maxmemory-policy": "allkeys-lru"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(GATEWAY_DURABLE_URL=evicting.url, GATEWAY_CACHE_URL=servers.cache_url,
               GATEWAY_DATABASE_URL=servers.database_url, GATEWAY_PORT="0")
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "refusing to start: fail redis-durable: maxmemory-policy is allkeys-lru" in result.stderr
    assert evicting.password not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_doctor_cli_exit_status(servers: ServerSet,
                                redis_factory: Callable[..., RedisServer]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(GATEWAY_DURABLE_URL=servers.durable_url, GATEWAY_CACHE_URL=servers.cache_url,
               GATEWAY_DATABASE_URL=servers.database_url)
    good = subprocess.run([sys.executable, "-m", "gateway.cli", "doctor"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert good.returncode == 0, good.stdout
    lines = good.stdout.strip().splitlines()
    assert lines and all(line.split()[0] in ("ok", "warn", "fail") for line in lines)
    env["GATEWAY_DURABLE_URL"] = redis_factory(
        "durable", **{"maxmemory-policy": "allkeys-lru"}).url
    bad = subprocess.run([sys.executable, "-m", "gateway.cli", "doctor"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert any(line.startswith("fail redis-durable") for line in bad.stdout.splitlines())
