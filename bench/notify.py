"""Notifications benchmark, side by side in one run.

1. *Fan-out*: one event published to a topic with 1,000 webhook subscriptions (all pointing
   at a local receiver) against a bare aiohttp client posting the same 1,000 signed bodies at
   once (one session, aiohttp's default of 100 connections, as the gateway's
   ``max_connections``). Deliveries per second from the publish's answer to the receiver's
   1,000th request; target >= 0.5 of the bare client's.
2. *One subscription, 10,000 rows*: 10,000 rows appended to its topic in one transaction
   against the same bare loop posting 10,000 signed bodies one after another (each awaited:
   a subscription delivers one row at a time). Target >= 0.5.
3. *Ingest*: ``POST /v1/webhooks/{source}`` driven by wrk, server CPU per request with
   delivery off (``[notifications] deliver = false``) against delivery on with 1,000 active
   subscriptions following ``webhook:<source>`` (waiting: no worker stores the webhooks, so
   their rows do not come). The difference is what notifications add to the ingest path (the
   ingest code itself writes nothing more to PostgreSQL). Target <= 5 %.

The gateway and the bare client run on one core (``--server-core``), the receiver, the
stores and wrk on the other. Figures are recorded in docs/performance.md.

    python bench/notify.py [--rounds 3] [--subscriptions 1000] [--rows 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import ingest
from gateway.stores import embedded
from gateway.stores.migrate import migrate_url

ADMIN = "bench-admin-token-0123456789"
SOURCE = "bench"

RECEIVER = """
import sys
from aiohttp import web

count = 0

async def receive(request):
    global count
    await request.read()
    count += 1
    return web.Response(status=200)

async def counted(request):
    global count
    if request.method == "DELETE":
        count = 0
    return web.Response(text=str(count))

app = web.Application()
app.router.add_post("/{tail:.*}", receive)
app.router.add_route("*", "/count", counted)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None,
            backlog=4096)
"""

# The bare client: the same signed bodies (the feed row's JSON, signed per subscription
# with the Standard Webhooks code the gateway uses), all at once or one after another.
BARE = """
import asyncio, base64, json, os, sys, time
import aiohttp
from gateway.outbound.standard_webhooks import sign_standard

url, count, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
row = json.dumps({"topic": "fan", "offset": 1, "epoch": 1, "kind": "event",
                  "payload": {"text": "hello"}, "created_at": "2026-12-03T00:00:00+00:00"},
                 separators=(",", ":")).encode()
keys = [os.urandom(24) for _ in range(count if mode == "fan" else 1)]

async def post(session, n):
    key = keys[n % len(keys)]
    headers = sign_standard(key, f"fan:{n}", int(time.time()), row)
    headers["Content-Type"] = "application/json"
    async with session.post(f"{url}/s{n % len(keys)}", data=row, headers=headers,
                            allow_redirects=False) as response:
        await response.content.read(65536)
        assert response.status == 200

async def main():
    async with aiohttp.ClientSession(trust_env=False) as session:
        await post(session, 0)  # the connection set up, as the gateway's is
        started = time.perf_counter()
        if mode == "fan":
            await asyncio.gather(*(post(session, n) for n in range(count)))
        else:
            for n in range(count):
                await post(session, n)
        print(count / (time.perf_counter() - started))

asyncio.run(main())
"""


def http(method: str, url: str, body: object | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    return json.loads(text) if text and text[0] in "{[" else text


def received(receiver: str) -> int:
    return int(str(http("GET", f"{receiver}/count")))


def wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {what} not within {timeout:.0f} s")
        time.sleep(0.002)  # polling the receiver's count, not synchronising our own code


def held(gateway: str) -> int:
    text = str(http("GET", f"{gateway}/metrics"))
    found = re.search(r"^gateway_notifications_held_subscriptions (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else 0


def subscribe(gateway: str, receiver: str, topic: str, count: int) -> list[str]:
    return [str(http("POST", f"{gateway}/v1/subscriptions", {  # type: ignore[index]
        "topic": topic, "destination": {"type": "webhook", "url": f"{receiver}/s{n}"}})["id"])
        for n in range(count)]


def bare(receiver: str, count: int, mode: str, core: int) -> float:
    out = subprocess.run(["taskset", "-c", str(core), sys.executable, "-c", BARE, receiver,
                          str(count), mode], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    return float(out.stdout.strip().splitlines()[-1])


async def append_rows(database_url: str, topic: str, count: int) -> None:
    """``count`` rows in one transaction (``feed.append_many``), then the last one's signal."""
    from gateway.push import feed
    from gateway.stores import redis as redis_clients
    from gateway.stores.postgres import create_pool

    pool = await create_pool(database_url, max_size=1)
    try:
        async with pool.acquire() as conn, conn.transaction():
            rows = await feed.append_many(conn, topic, [("event", {"text": f"row {n}"})
                                                        for n in range(count)])
    finally:
        await pool.close()
    cache = redis_clients.connect(os.environ["BENCH_CACHE_URL"], variable="bench")
    try:
        await feed.publish(cache, rows[-1])
    finally:
        await cache.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--subscriptions", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--load-core", type=int, default=1)
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("bench: needs wrk (apt-get install -y wrk)")
    root = Path(tempfile.mkdtemp(prefix="gwn-"))
    servers: list[embedded.RedisServer | embedded.PostgresServer] = []
    try:
        durable = embedded.RedisServer("durable", root / "durable",
                                       embedded.new_password()).start()
        cache = embedded.RedisServer("cache", root / "cache", embedded.new_password()).start()
        pg = embedded.PostgresServer(root / "pg" / "data").start()
        servers += [durable, cache, pg]
        for server in (durable, cache):
            assert server.proc is not None
            ingest.pin(server.proc.pid, args.load_core)
        asyncio.run(migrate_url(pg.url))
        os.environ["BENCH_CACHE_URL"] = cache.url
        port, receiver_port = embedded.free_port(), embedded.free_port()
        gateway, receiver = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{receiver_port}"
        config = root / "gateway.toml"
        env = {**os.environ, "GATEWAY_DURABLE_URL": durable.url, "GATEWAY_CACHE_URL": cache.url,
               "GATEWAY_DATABASE_URL": pg.url, "GATEWAY_HOST": "127.0.0.1",
               "GATEWAY_PORT": str(port), "GATEWAY_ADMIN_TOKEN": ADMIN,
               "GATEWAY_WEBHOOK_SECRETS": f"{SOURCE}={ingest.SECRET}",
               "GATEWAY_CONFIG": str(config), "GATEWAY_LOG_LEVEL": "WARNING"}
        gateway_cmd = ["taskset", "-c", str(args.server_core), sys.executable, "-m",
                       "gateway.cli", "serve"]
        receiver_cmd = ["taskset", "-c", str(args.load_core), sys.executable, "-c", RECEIVER,
                        str(receiver_port)]
        print(f"gateway and bare client on core {args.server_core}; receiver, stores and wrk "
              f"on core {args.load_core}; {os.cpu_count()} cores")
        with ingest.process(receiver_cmd, env, root / "receiver.log"):
            ingest.wait_http(f"{receiver}/count")
            delivery_runs(args, root, env, gateway_cmd, config, gateway, receiver, pg.url)
        ingest_runs(args, root, env, gateway_cmd, config, gateway, receiver, durable.url)
    finally:
        embedded.stop_all(servers)
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
    return 0


DELIVERING = """
[notifications]
allow_http = true
allow_private_networks = true
lease_seconds = 3
"""


def delivery_runs(args: argparse.Namespace, root: Path, env: dict[str, str],
                  gateway_cmd: list[str], config: Path, gateway: str, receiver: str,
                  database_url: str) -> None:
    config.write_text(DELIVERING)
    fan_ratios, row_ratios = [], []
    with ingest.process(gateway_cmd, env, root / "gateway-deliver.log"):
        ingest.wait_http(f"{gateway}/healthz")
        subscribe(gateway, receiver, "fan", args.subscriptions)
        [single] = subscribe(gateway, receiver, "rows", 1)
        wait_for(lambda: held(gateway) == args.subscriptions + 1, 60, "every subscription held")
        for round_no in range(1, args.rounds + 1):
            http("DELETE", f"{receiver}/count")
            started = time.perf_counter()
            http("POST", f"{gateway}/v1/topics/fan/events", {"text": "hello"})
            wait_for(lambda: received(receiver) >= args.subscriptions, 120, "the fan-out")
            ours = args.subscriptions / (time.perf_counter() - started)
            theirs = bare(receiver, args.subscriptions, "fan", args.server_core)
            fan_ratios.append(ours / theirs)
            print(f"round {round_no}  fan-out to {args.subscriptions}: gateway {ours:,.0f} "
                  f"deliveries/s, bare client {theirs:,.0f}/s, ratio {ours / theirs:.2f}")
            http("DELETE", f"{receiver}/count")
            started = time.perf_counter()
            asyncio.run(append_rows(database_url, "rows", args.rows))
            wait_for(lambda: received(receiver) >= args.rows, 600, "the rows")
            ours = args.rows / (time.perf_counter() - started)
            theirs = bare(receiver, args.rows, "rows", args.server_core)
            row_ratios.append(ours / theirs)
            print(f"round {round_no}  {args.rows} rows to subscription {single}: gateway "
                  f"{ours:,.0f} rows/s, bare loop {theirs:,.0f}/s, ratio {ours / theirs:.2f}")
    print(f"median fan-out ratio {statistics.median(fan_ratios):.2f}, one-subscription "
          f"ratio {statistics.median(row_ratios):.2f} (targets >= 0.5)")


def ingest_runs(args: argparse.Namespace, root: Path, env: dict[str, str],
                gateway_cmd: list[str], config: Path, gateway: str, receiver: str,
                durable_url: str) -> None:
    """wrk on POST /v1/webhooks/<source>: delivery off, then on with the subscriptions of
    webhook:<source> held (and waiting), CPU per request of each."""
    timestamp = int(time.time())
    script, body = root / "signed.lua", root / "body.json"
    script.write_text(ingest.WRK_SCRIPT)
    body.write_bytes(ingest.BODY)
    url = f"{gateway}/v1/webhooks/{SOURCE}"
    added: list[float] = []
    subscribed = False
    for round_no in range(1, args.rounds + 1):
        cost: dict[str, float] = {}
        # Delivery on as deployed (default lease and poll timings).
        for name, text in (("off", "[notifications]\ndeliver = false\n"),
                           ("on", "[notifications]\nallow_http = true\n"
                                  "allow_private_networks = true\n")):
            config.write_text(text + "[quotas]\nitems_per_source = 0\nbytes_per_source = 0\n")
            ingest.fresh_durable(durable_url)
            with ingest.process(gateway_cmd, env, root / f"ingest-{name}.log") as proc:
                ingest.wait_http(f"{gateway}/healthz")
                if name == "on":
                    if not subscribed:
                        subscribe(gateway, receiver, f"webhook:{SOURCE}", args.subscriptions)
                        subscribed = True
                    wait_for(lambda: held(gateway) >= args.subscriptions, 60, "held")
                warm, measure = root / f"w-{round_no}-{name}", root / f"m-{round_no}-{name}"
                ingest.sign_file(warm, f"w{round_no}{name}", 20_000, timestamp)
                ingest.sign_file(measure, f"m{round_no}{name}", 200_000, timestamp)
                ingest.run_wrk(url, script, warm, timestamp, body, 2, args.connections,
                               args.load_core, name)
                before = ingest.cpu_seconds(proc.pid)
                result = ingest.run_wrk(url, script, measure, timestamp, body, args.duration,
                                        args.connections, args.load_core, f"deliver-{name}")
                answered = sum(result.statuses.values()) or 1
                result.cpu_us = (ingest.cpu_seconds(proc.pid) - before) / answered * 1e6
                cost[name] = result.cpu_us
                print(f"round {round_no}  " + result.line())
        added.append(cost["on"] / cost["off"] - 1)
        print(f"round {round_no}  ingest CPU per request: {cost['off']:.0f} us with delivery "
              f"off, {cost['on']:.0f} us on: {added[-1]:+.1%}")
    print(f"median added cost on POST /v1/webhooks/{{source}}: {statistics.median(added):+.1%}"
          " of its CPU (target <= 5 %)")


if __name__ == "__main__":
    raise SystemExit(main())
