"""Doctor verdicts against deliberately misconfigured real instances."""

from collections.abc import Callable
from dataclasses import replace

import pytest

from gateway.config import Settings
from gateway.stores import doctor
from gateway.stores.embedded import RedisServer


def statuses(checks: list[doctor.Check], subject: str) -> list[tuple[str, str]]:
    return [(c.status, c.message) for c in checks if c.subject == subject]


async def test_correct_topology_passes(settings: Settings) -> None:
    checks = await doctor.run_checks(settings)
    assert not doctor.has_failure(checks), [c.line() for c in checks]
    assert any(c.subject == "postgres" and c.message == "schema current" for c in checks)


async def test_durable_with_lru_fails(settings: Settings,
                                      redis_factory: Callable[..., RedisServer]) -> None:
    bad = redis_factory("durable", **{"maxmemory-policy": "allkeys-lru"})
    checks = await doctor.run_checks(replace(settings, durable_url=bad.url))
    assert doctor.has_failure(checks)
    assert any(s == "fail" and "allkeys-lru" in m for s, m in statuses(checks, "redis-durable"))


async def test_durable_without_aof_fails(settings: Settings,
                                         redis_factory: Callable[..., RedisServer]) -> None:
    bad = redis_factory("durable", appendonly="no")
    checks = await doctor.run_checks(replace(settings, durable_url=bad.url))
    assert any(s == "fail" and "appendonly" in m for s, m in statuses(checks, "redis-durable"))


async def test_cache_without_eviction_fails(settings: Settings,
                                            redis_factory: Callable[..., RedisServer]) -> None:
    bad = redis_factory("cache", **{"maxmemory-policy": "noeviction"})
    checks = await doctor.run_checks(replace(settings, cache_url=bad.url))
    assert any(s == "fail" and "noeviction" in m for s, m in statuses(checks, "redis-cache"))


async def test_same_instance_for_both_roles_fails(settings: Settings) -> None:
    assert settings.durable_url
    checks = await doctor.run_checks(replace(settings, cache_url=settings.durable_url))
    assert any(c.subject == "topology" and c.status == "fail" for c in checks)


async def test_unreachable_stores_fail_without_traceback(settings: Settings) -> None:
    checks = await doctor.run_checks(replace(
        settings, durable_url="redis://127.0.0.1:1/0",
        database_url="postgresql://postgres@127.0.0.1:1/postgres"))
    assert any(c.subject == "redis-durable" and c.status == "fail" for c in checks)
    assert any(c.subject == "postgres" and c.status == "fail" for c in checks)


@pytest.mark.parametrize("overrides", [{}, {"requirepass": ""}])
async def test_auth_check(settings: Settings, redis_factory: Callable[..., RedisServer],
                          overrides: dict[str, str]) -> None:
    server = redis_factory("cache", **overrides)
    url = server.url if overrides == {} else f"redis://127.0.0.1:{server.port}/0"
    checks = await doctor.run_checks(replace(settings, cache_url=url))
    expected = "ok" if not overrides else "warn"
    assert any(s == expected and ("password" in m) for s, m in statuses(checks, "redis-cache"))


def test_a_low_open_file_limit_is_a_warning(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import resource

    from gateway.stores import doctor
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 1024))
    check = doctor.fd_check()
    assert check.status == "warn" and "1024" in check.message
    monkeypatch.setattr(resource, "getrlimit", lambda which: (65536, 65536))
    assert doctor.fd_check().status == "ok"
