"""Instructions per signed webhook in ``gateway serve``, counted by valgrind's callgrind: a
figure that other work on the machine does not move, for A/B of changes too small for the
rates of ``bench/ingest.py`` on a shared machine.

The server runs under ``valgrind --tool=callgrind`` with instrumentation off; a client in this
process (asyncio, ``--connections`` keep-alive connections, each sending its next request
when the previous answer is in) sends ``--warmup`` deliveries, then instrumentation is switched
on (``callgrind_control -i on``) for ``--requests`` more, then off, and the count is read
from the dump. Every delivery is the ingest bench's: a fresh Standard Webhooks id, valid
signature, the same body, the whole path (barrier, verification, claim + ADD).

    python bench/ingest_instructions.py [--requests 2000] [--compare DIR] [--pairs 2]

``--compare DIR``: also the checkout DIR (PYTHONPATH), the two in turn (this one first in
odd pairs). Needs valgrind. The count includes the server's background services and the
loop's waits for redis-durable; with the server ~50x slower under valgrind, requests are
always waiting, so both trees see the same batching.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import ingest
from gateway.inbound import signing
from gateway.stores import embedded
from gateway.stores.migrate import migrate_url


def requests_for(prefix: str, count: int, port: int) -> list[bytes]:
    key = base64.b64decode(ingest.SECRET.removeprefix("whsec_"))
    timestamp = int(time.time())
    out = []
    for n in range(count):
        msg_id = f"{prefix}-{n}"
        signature = signing.standard_signature(key, msg_id, timestamp, ingest.BODY)
        out.append((f"POST /v1/webhooks/bench HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    f"Content-Type: application/json\r\nwebhook-id: {msg_id}\r\n"
                    f"webhook-timestamp: {timestamp}\r\nwebhook-signature: {signature}\r\n"
                    f"Content-Length: {len(ingest.BODY)}\r\n\r\n").encode() + ingest.BODY)
    return out


async def drive(port: int, wire: list[bytes], connections: int) -> dict[int, int]:
    """Send every request of ``wire`` over ``connections`` keep-alive connections, one at a
    time on each; the tally of answers by status."""
    queue = list(reversed(wire))
    statuses: dict[int, int] = {}

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while queue:
                writer.write(queue.pop())
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                await reader.readexactly(length)
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return statuses


def _dumped(out_file: Path, pid: int, part: int) -> int:
    """Dump callgrind's counters (which zeroes them) and return the dumped count."""
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    text = Path(f"{out_file}.{part}").read_text(errors="replace")
    return sum(int(m) for m in re.findall(r"^totals: (\d+)", text, re.M))


def count(name: str, cmd: list[str], env: dict[str, str], port: int, root: Path,
          args: argparse.Namespace, tag: str) -> float:
    """Instructions per request, less what the idle process runs in the same wall time
    (its background services' timers, ~3 ms of CPU a second natively: under valgrind a
    request takes ~50x its time, so that share would otherwise swamp a difference)."""
    out_file = root / f"callgrind.{tag}.out"
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out_file}"]
    with ingest.process([*valgrind, *cmd], env, root / f"{tag}.log") as proc:
        ingest.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=600)
        asyncio.run(drive(port, requests_for(f"w{tag}", args.warmup, port), args.connections))
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True,
                       capture_output=True)
        _dumped(out_file, proc.pid, 1)  # zero
        started = time.monotonic()
        statuses = asyncio.run(drive(port, requests_for(f"m{tag}", args.requests, port),
                                     args.connections))
        busy = _dumped(out_file, proc.pid, 2)
        wall = time.monotonic() - started
        time.sleep(args.idle)  # the idle process's own rate, not a synchronisation
        idle = _dumped(out_file, proc.pid, 3)
        idle_wall = time.monotonic() - started - wall
    rate = idle / idle_wall
    per = (busy - rate * wall) / args.requests
    print(f"{name:<10} {per:12,.0f} instructions per request ({busy / args.requests:,.0f} "
          f"less idle {rate * wall / args.requests:,.0f}; {args.requests} requests in "
          f"{wall:.0f} s, answers {statuses})", flush=True)
    return per


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--idle", type=float, default=10.0,
                        help="seconds of the idle server counted after the requests")
    parser.add_argument("--compare", metavar="DIR")
    args = parser.parse_args()
    if not shutil.which("valgrind"):
        raise SystemExit("bench: needs valgrind")
    root = Path(tempfile.mkdtemp(prefix="gwi-"))
    servers: list[embedded.RedisServer | embedded.PostgresServer] = []
    try:
        durable = embedded.RedisServer("durable", root / "durable",
                                       embedded.new_password()).start()
        servers.append(durable)
        cache = embedded.RedisServer("cache", root / "cache", embedded.new_password()).start()
        servers.append(cache)
        pg = embedded.PostgresServer(root / "pg" / "data").start()
        servers.append(pg)
        asyncio.run(migrate_url(pg.url))
        port = embedded.free_port()
        env = {**os.environ, "GATEWAY_DURABLE_URL": durable.url,
               "GATEWAY_CACHE_URL": cache.url, "GATEWAY_DATABASE_URL": pg.url,
               "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": str(port),
               "GATEWAY_WEBHOOK_SECRETS": f"bench={ingest.SECRET}",
               "GATEWAY_LOG_LEVEL": "WARNING", "GATEWAY_LOOP": "asyncio"}
        cmd = [sys.executable, "-m", "gateway.cli", "serve"]
        # -P: python -m would put the working directory (this checkout) first.
        runs = [("gateway", cmd, env)]
        if args.compare:
            runs.append(("gw-compare", [sys.executable, "-P", "-m", "gateway.cli", "serve"],
                         {**env, "PYTHONPATH": args.compare}))
        figures: dict[str, list[float]] = {name: [] for name, _, _ in runs}
        for pair in range(1, args.pairs + 1):
            ordered = runs if pair % 2 else runs[::-1]
            for name, run_cmd, run_env in ordered:
                ingest.fresh_durable(durable.url)
                figures[name].append(count(name, run_cmd, run_env, port, root,
                                           args, f"{pair}-{name}"))
        if args.compare:
            for a, b in zip(figures["gateway"], figures["gw-compare"], strict=True):
                print(f"gateway / gw-compare = {a / b:.4f} ({a - b:+,.0f} per request)")
    finally:
        embedded.stop_all(servers)
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
