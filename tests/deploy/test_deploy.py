"""deploy/ must be usable as shipped: the Redis configs start real servers with the policies
the design requires; compose, Dockerfile and systemd units are well-formed."""

import configparser
import ipaddress
import tempfile
import tomllib
from pathlib import Path

import pytest
import redis
import yaml

from gateway.security.brute import BruteSettings
from gateway.stores import embedded

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.mark.parametrize(("role", "expected"), [
    ("durable", {"maxmemory-policy": "noeviction", "appendonly": "yes",
                 "appendfsync": "everysec"}),
    ("cache", {"maxmemory-policy": "allkeys-lru", "appendonly": "no", "save": ""}),
])
def test_redis_config_starts_a_server_with_its_policy(role: embedded.Role,
                                                     expected: dict[str, str]) -> None:
    server = embedded.RedisServer(role, Path(tempfile.mkdtemp(prefix="gwd-")),
                                  embedded.new_password()).start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        for name, value in expected.items():
            assert client.config_get(name)[name] == value, name
        assert int(client.config_get("maxmemory")["maxmemory"]) > 0
        assert client.config_get("requirepass")["requirepass"]
        client.close()
    finally:
        server.stop()


def test_redis_configs_bind_internal_interfaces_and_document_tls() -> None:
    for role in ("durable", "cache"):
        text = (DEPLOY / "redis" / f"{role}.conf").read_text()
        assert "\nbind 127.0.0.1 -::1\n" in text
        assert "\nrequirepass " in text
        assert "# tls-port" in text and "# tls-cert-file" in text


def test_compose_has_every_service_with_health_checks_and_volumes() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"gateway", "worker", "redis-durable", "redis-cache", "postgres"} <= set(services)
    for name in ("gateway", "redis-durable", "redis-cache", "postgres"):
        assert "healthcheck" in services[name], name
    durable_volumes = {v.split(":")[0] for v in services["redis-durable"]["volumes"]}
    postgres_volumes = {v.split(":")[0] for v in services["postgres"]["volumes"]}
    assert "durable-data" in durable_volumes and "postgres-data" in postgres_volumes
    assert durable_volumes.isdisjoint(postgres_volumes)
    assert "volumes" not in services["redis-cache"] or all(
        v.endswith(":ro") for v in services["redis-cache"]["volumes"])
    assert services["worker"]["command"][0] == "worker"


def test_systemd_units_parse_and_run_gateway() -> None:
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert {u.name for u in units} >= {"gateway.service", "gateway-worker@.service",
                                       "redis-durable.service", "redis-cache.service"}
    for unit in units:
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.read_string(unit.read_text())
        assert {"Unit", "Service", "Install"} <= set(parser.sections()), unit.name
        assert parser["Service"]["ExecStart"].startswith("/"), unit.name
        # Enough descriptors for the connection and stream caps, which follow the limit
        # (and well above doctor's 4096 warning).
        assert int(parser["Service"]["LimitNOFILE"]) >= 65535, unit.name


def test_dockerfile_runs_gateway_as_unprivileged_user() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["gateway"]' in text and "\nUSER gateway\n" in text


def test_compose_trusts_its_proxy_and_nothing_else() -> None:
    """The barrier's client address in compose: the gateway publishes no port, the `proxy`
    service does, at a fixed address in the network's fixed subnet, and gateway.toml (where
    GATEWAY_CONFIG points, mounted read-only) trusts exactly that address."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    gateway, proxy = services["gateway"], services["proxy"]
    assert "ports" not in gateway and proxy["ports"] == ["8080:8080"]
    assert "--to" in proxy["command"] and "gateway:8080" in proxy["command"]
    address = ipaddress.ip_address(proxy["networks"]["default"]["ipv4_address"])
    subnet = compose["networks"]["default"]["ipam"]["config"][0]["subnet"]
    assert address in ipaddress.ip_network(subnet)
    source, target, mode = next(v for v in gateway["volumes"] if "gateway.toml" in v).split(":")
    assert gateway["environment"]["GATEWAY_CONFIG"] == target and mode == "ro"
    security = tomllib.loads((DEPLOY / source).read_text())["security"]
    trusted = BruteSettings.from_section(security).trusted_proxies
    assert trusted == (ipaddress.ip_network(address),)
