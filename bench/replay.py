"""What GitHub's replay window costs: signed GitHub deliveries against ``gateway serve`` with
the body window (the default for ``github`` sources) and without it, in one invocation.

Each request is a distinct push delivery (its own body, delivery id and signature), so the
window writes one ``dedup:webhook-body:`` mark per request on top of the claim and ADD: the
extra work is one script call in the same coalesced round trip. A third run sends one
captured body under fresh delivery ids (the replay), answered ``duplicate`` without reaching
the intake. Same set-up as ``bench/ingest.py`` (server on one core, wrk and the stores on
the other); prints req/s, server CPU per request and redis-durable CPU per request for each,
and the ratios window/no window.

    python bench/replay.py [--duration 8] [--connections 64] [--rounds 2]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import ingest
from gateway.inbound import signing
from gateway.stores import embedded
from gateway.stores.migrate import migrate_url

SECRET = "bench-github-secret"
# One request per line: "<delivery id>\t<signature>\t<body>" (the bodies hold no tab).
WRK_SCRIPT = ingest.STATUS_TALLY + """
local lines, i = {}, 0
function init(args)
  for line in io.lines(args[1]) do lines[#lines + 1] = line end
end
function request()
  i = i + 1
  local id, sig, body = string.match(lines[(i - 1) % #lines + 1], "^([^\\t]+)\\t([^\\t]+)\\t(.+)$")
  return wrk.format("POST", nil, {["Content-Type"] = "application/json",
    ["X-GitHub-Event"] = "push", ["X-GitHub-Delivery"] = id,
    ["X-Hub-Signature-256"] = sig}, body)
end
"""


def deliveries(path: Path, prefix: str, count: int, same_body: bool) -> None:
    """``count`` signed push deliveries; ``same_body``: one body under fresh ids (a replay)."""
    now = int(time.time())
    with path.open("w") as out:
        for n in range(count):
            after = "0" if same_body else f"{prefix}-{n:x}"  # unique across runs too
            body = json.dumps({"ref": "refs/heads/main", "after": after,
                               "repository": {"full_name": "o/r", "pushed_at": now},
                               "head_commit": {"message": "bench push"}}).encode()
            signature = signing.github_signature(SECRET.encode(), body)
            out.write(f"{prefix}-{n}\t{signature}\t{body.decode()}\n")


def main() -> int:
    args = ingest.wrk_parser(__doc__, duration=8, ids=100_000).parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("bench: needs wrk (apt-get install -y wrk)")
    root = Path(tempfile.mkdtemp(prefix="gwr-"))
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
        assert durable.proc is not None
        asyncio.run(migrate_url(pg.url))
        script = root / "github.lua"
        script.write_text(WRK_SCRIPT)
        port = embedded.free_port()
        url = f"http://127.0.0.1:{port}/v1/webhooks/gh"
        env = {**os.environ, "GATEWAY_DURABLE_URL": durable.url, "GATEWAY_CACHE_URL": cache.url,
               "GATEWAY_DATABASE_URL": pg.url, "GATEWAY_HOST": "127.0.0.1",
               "GATEWAY_PORT": str(port), "GATEWAY_WEBHOOK_SECRETS": f"gh=github:{SECRET}",
               "GATEWAY_LOG_LEVEL": "WARNING"}
        off = root / "off.toml"
        off.write_text("[webhooks.gh]\nreplay_window_seconds = 0\n")
        cmd = ["taskset", "-c", str(args.server_core), sys.executable, "-m", "gateway.cli",
               "serve"]
        runs = [("window", env, False), ("nowindow", {**env, "GATEWAY_CONFIG": str(off)}, False),
                ("replayed", env, True)]
        print(f"wrk -t1 -c{args.connections} -d{args.duration}s on core {args.load_core}; "
              f"server on core {args.server_core}; load {os.getloadavg()[0]:.2f}")
        cpu_ratios: list[float] = []
        for round_no in range(1, args.rounds + 1):
            results: dict[str, ingest.Result] = {}
            for name, run_env, same_body in runs:
                ingest.fresh_durable(durable.url)
                warm, measure = root / f"warm-{round_no}-{name}", root / f"m-{round_no}-{name}"
                deliveries(warm, f"w{round_no}{name}", 20_000, same_body)
                deliveries(measure, f"m{round_no}{name}", args.ids, same_body)
                with ingest.process(cmd, run_env, root / f"{name}-{round_no}.log") as proc:
                    ingest.wait_http(f"http://127.0.0.1:{port}/healthz")
                    ingest.run_wrk(url, script, warm, 0, warm, args.warmup, args.connections,
                                   args.load_core, name)
                    before, redis_before = (ingest.cpu_seconds(proc.pid),
                                            ingest.cpu_seconds(durable.proc.pid))
                    result = ingest.run_wrk(url, script, measure, 0, measure, args.duration,
                                            args.connections, args.load_core, name)
                    answered = sum(result.statuses.values()) or 1
                    result.cpu_us = (ingest.cpu_seconds(proc.pid) - before) / answered * 1e6
                    result.redis_us = ((ingest.cpu_seconds(durable.proc.pid) - redis_before)
                                       / answered * 1e6)
                results[name] = result
                print(f"round {round_no}  " + result.line())
            window, plain = results["window"], results["nowindow"]
            cpu_ratios.append(window.cpu_us / plain.cpu_us)
            print(f"round {round_no}  window/nowindow = {window.rps / plain.rps:.2f} req/s, "
                  f"{cpu_ratios[-1]:.2f} server CPU per request, "
                  f"{window.redis_us / plain.redis_us:.2f} redis CPU per request; "
                  f"replayed/nowindow = {results['replayed'].cpu_us / plain.cpu_us:.2f} CPU")
        print(f"median server CPU per request window/nowindow over {args.rounds} round(s): "
              f"{statistics.median(cpu_ratios):.2f}; load {os.getloadavg()[0]:.2f}")
    finally:
        embedded.stop_all(servers)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
