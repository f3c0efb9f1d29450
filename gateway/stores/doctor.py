"""Topology checks: is the durable instance really durable and non-evicting, does
the cache evict, are they two processes, is PostgreSQL reachable and its schema current?

``gateway doctor`` prints these; ``gateway serve`` runs them and refuses to start on a fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError

from gateway.config import Settings, redact_url
from gateway.stores import migrate
from gateway.stores import redis as redis_clients
from gateway.stores.reach import reason
from gateway.stores.redis import AnyRedis

Status = Literal["ok", "warn", "fail"]
TIMEOUT = 5.0


@dataclass(frozen=True)
class Check:
    status: Status
    subject: str
    message: str

    def line(self) -> str:
        return f"{self.status:<4} {self.subject}: {self.message}"


def _every_node(client: AnyRedis) -> dict[str, Any]:
    """On a cluster, ask every node: one misconfigured node can evict or lose its slots."""
    return {"target_nodes": RedisCluster.ALL_NODES} if isinstance(client, RedisCluster) else {}


async def _config(client: AnyRedis, name: str) -> str | None:
    """One CONFIG GET value; None where CONFIG is disabled (some managed services). A cluster
    answers per node; nodes that disagree give ``mixed (...)``, which no check accepts."""
    try:
        value: Any = await client.config_get(name, **_every_node(client))
    except ResponseError:
        return None
    if not isinstance(value, dict):
        return None
    nested = [v for v in value.values() if isinstance(v, dict)]
    per_node: list[dict[Any, Any]] = nested if len(nested) == len(value) else [value]
    found = sorted({str(v[name]) for v in per_node if v.get(name) is not None})
    if not found:
        return None
    return found[0] if len(found) == 1 else f"mixed ({', '.join(found)})"


async def _server_ids(client: AnyRedis) -> set[str]:
    """The run ids of every node: two roles sharing any node share a process."""
    info = await client.info("server", **_every_node(client))
    per_node = [info] if "run_id" in info else list(info.values())
    return {str(node["run_id"]) for node in per_node if isinstance(node, dict)
            and node.get("run_id")}


async def _waitaof_check(client: AnyRedis, subject: str) -> Check:
    """``GATEWAY_DURABLE_ACK=aof`` needs WAITAOF (Redis 7.2+, Valkey): ask every node."""
    try:
        await client.execute_command("WAITAOF", "0", "0", "0", **_every_node(client))
    except ResponseError as exc:
        return Check("fail", subject, f"GATEWAY_DURABLE_ACK=aof needs WAITAOF (Redis 7.2 or "
                     f"later, or Valkey); the server answers: {str(exc)[:80]}")
    return Check("ok", subject, "WAITAOF available (GATEWAY_DURABLE_ACK=aof)")


async def check_durable(client: AnyRedis, url: str, durable_ack: str = "none") -> list[Check]:
    subject = "redis-durable"
    checks = [Check("ok", subject, f"reachable at {redact_url(url)}")]
    if durable_ack == "aof":
        checks.append(await _waitaof_check(client, subject))
        fsync_policy = await _config(client, "appendfsync")
        if fsync_policy not in (None, "always"):
            checks.append(Check("warn", subject, f"GATEWAY_DURABLE_ACK=aof with appendfsync "
                                f"{fsync_policy}: every acknowledgement waits for the next "
                                "periodic fsync (~100 ms); appendfsync always fsyncs each "
                                "batch and costs little more"))
    policy = await _config(client, "maxmemory-policy")
    if policy is None:
        checks.append(Check("warn", subject, "CONFIG GET is disabled; cannot verify policies"))
        return checks
    checks.append(Check("ok", subject, "maxmemory-policy noeviction") if policy == "noeviction"
                  else Check("fail", subject, f"maxmemory-policy is {policy}: it can evict "
                             "queued items, dedup claims and leases; set noeviction"))
    maxmemory = await _config(client, "maxmemory")
    checks.append(Check("ok", subject, f"maxmemory {maxmemory} bytes") if maxmemory not in
                  (None, "0") else Check("warn", subject, "maxmemory is 0 (unbounded): "
                                         "set a cap so overload becomes backpressure"))
    appendonly = await _config(client, "appendonly")
    fsync = await _config(client, "appendfsync")
    if appendonly != "yes":
        checks.append(Check("fail", subject, "appendonly is off: a restart loses queued work"))
    elif fsync not in ("everysec", "always"):
        checks.append(Check("warn", subject, f"appendonly yes but appendfsync {fsync}"))
    else:
        checks.append(Check("ok", subject, f"appendonly yes, appendfsync {fsync}"))
    checks.append(await _auth_check(client, subject))
    return checks


async def check_cache(client: AnyRedis, url: str) -> list[Check]:
    subject = "redis-cache"
    checks = [Check("ok", subject, f"reachable at {redact_url(url)}")]
    policy = await _config(client, "maxmemory-policy")
    if policy is None:
        checks.append(Check("warn", subject, "CONFIG GET is disabled; cannot verify policies"))
        return checks
    if policy == "noeviction":
        checks.append(Check("fail", subject, "maxmemory-policy noeviction: the cache would "
                            "refuse writes when full; set allkeys-lru"))
    elif policy.startswith("allkeys-"):
        checks.append(Check("ok", subject, f"maxmemory-policy {policy}"))
    else:
        checks.append(Check("warn", subject, f"maxmemory-policy {policy}: allkeys-lru "
                            "is expected"))
    maxmemory = await _config(client, "maxmemory")
    checks.append(Check("ok", subject, f"maxmemory {maxmemory} bytes") if maxmemory not in
                  (None, "0") else Check("fail", subject, "maxmemory is 0: the cache never "
                                         "evicts and can grow without bound"))
    if await _config(client, "appendonly") == "yes":
        checks.append(Check("warn", subject, "appendonly yes: persistence is wasted here"))
    checks.append(await _auth_check(client, subject))
    return checks


async def _auth_check(client: AnyRedis, subject: str) -> Check:
    requirepass = await _config(client, "requirepass")
    if requirepass:
        return Check("ok", subject, "password required")
    with contextlib.suppress(ResponseError):
        users = await client.acl_list()
        if any("nopass" not in str(u) for u in users):
            return Check("ok", subject, "ACL users configured")
    return Check("warn", subject, "no password: anyone who reaches the port can write")


async def check_postgres(dsn: str) -> list[Check]:
    subject = "postgres"
    try:
        conn = await asyncio.wait_for(asyncpg.connect(dsn), TIMEOUT)
    except Exception as exc:
        return [Check("fail", subject, f"unreachable at {redact_url(dsn)}: {reason(exc)}")]
    try:
        version = await conn.fetchval("SHOW server_version")
        missing = await migrate.pending(conn)
        vectors = None if missing else await conn.fetchrow(_VECTORS)
        embedders = [] if missing else await conn.fetch(_EMBEDDERS)
    finally:
        await conn.close()
    checks = [Check("ok", subject, f"reachable, PostgreSQL {version}")]
    if missing:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in missing)
        checks.append(Check("fail", subject,
                            f"schema behind: {names} pending; run gateway migrate"))
        return checks
    checks.append(Check("ok", subject, "schema current"))
    checks.append(vector_check(vectors))
    if len(embedders) > 1:
        found = ", ".join(f"{r['embedder']}: {r['chunks']}" for r in embedders)
        checks.append(Check("warn", "search", f"chunk vectors of {len(embedders)} embedders "
                            f"({found}): search reads only the configured one's; "
                            "gateway reembed re-embeds the others"))
    return checks


_VECTORS = """
SELECT format_type(a.atttypid, a.atttypmod) AS type,
       (SELECT extversion FROM pg_extension WHERE extname = 'vector') AS installed,
       (SELECT default_version FROM pg_available_extensions WHERE name = 'vector') AS available
FROM pg_attribute a
WHERE a.attrelid = 'pipeline_chunks'::regclass AND a.attname = 'embedding'
"""
_EMBEDDERS = """
SELECT embedder, count(*) AS chunks FROM pipeline_chunks
WHERE embedder IS NOT NULL GROUP BY embedder ORDER BY embedder
"""


def vector_check(row: Any) -> Check:
    """Which search the database gives: pgvector's HNSW indexes or a scan of every chunk."""
    if row["type"] == "vector":
        return Check("ok", "search", f"pgvector {row['installed']}: HNSW index per embedder "
                     "(cosine)")
    if row["available"]:
        return Check("warn", "search", f"pgvector {row['available']} is available but unused "
                     "(gateway.pgvector = off or no privilege when migrating): search scans "
                     "every chunk; docs/architecture.md §8 says how to switch")
    return Check("warn", "search", "no pgvector extension on this server: search scans "
                 "every chunk; install the server's pgvector package (docs/architecture.md §8)")


async def _redis_checks(url: str | None, variable: str, role: str,
                        durable_ack: str = "none") -> tuple[list[Check], set[str]]:
    if not url:
        return [Check("fail", f"redis-{role}", f"{variable} is not set")], set()
    client = redis_clients.connect(url, variable=variable)
    try:
        await asyncio.wait_for(client.ping(), TIMEOUT)
        checks = await asyncio.wait_for(
            check_durable(client, url, durable_ack) if role == "durable"
            else check_cache(client, url), TIMEOUT)
        return checks, await _server_ids(client)
    except (RedisError, OSError, TimeoutError) as exc:
        return [Check("fail", f"redis-{role}",
                      f"unreachable at {redact_url(url)}: {reason(exc)}")], set()
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()


FDS_WANTED = 4096


def fd_check() -> Check:
    """Each stream and connection holds a descriptor: a low limit caps the server early."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < FDS_WANTED:
        return Check("warn", "process", f"open-file limit {soft}: raise it to {FDS_WANTED} "
                     "or more (LimitNOFILE=, ulimit -n); streams are capped at half of it")
    return Check("ok", "process", f"open-file limit {soft}")


async def run_checks(settings: Settings) -> list[Check]:
    (durable, durable_id), (cache, cache_id) = await asyncio.gather(
        _redis_checks(settings.durable_url, "GATEWAY_DURABLE_URL", "durable",
                      settings.durable_ack),
        _redis_checks(settings.cache_url, "GATEWAY_CACHE_URL", "cache"),
    )
    checks = durable + cache
    if durable_id & cache_id:
        checks.append(Check("fail", "topology", "durable and cache URLs reach the same Redis "
                            "process; they must be two instances"))
    elif durable_id and cache_id:
        checks.append(Check("ok", "topology", "durable and cache are separate processes"))
    if settings.database_url:
        checks += await check_postgres(settings.database_url)
    else:
        checks.append(Check("fail", "postgres", "GATEWAY_DATABASE_URL is not set"))
    checks.append(fd_check())
    return checks


def has_failure(checks: list[Check]) -> bool:
    return any(c.status == "fail" for c in checks)
