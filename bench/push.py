"""Push benchmark: feed commit → receipt by N SSE clients of ``gateway serve``, side by side
with two references on the same machine in the same invocation: a bare redis-py subscriber of
the same ``PUBLISH`` (the floor of one receiver), and a bare fan-out (one Python process on
the same event loop, the same subscriber, each row's SSE frame encoded once and written to
the N sockets in one loop: the floor of any one-process fan-out, what ``sse/fan`` divides by).

Layout on a 2-core machine: the gateway server (or the bare fan-out) alone on
``--server-core``; the stores, the writer + bare subscriber process and the SSE client process
on ``--load-core``. Times are ``time.perf_counter()`` (CLOCK_MONOTONIC, the same clock in
every process of the host): the writer stamps each row right after its transaction commits,
before the PUBLISH; receivers stamp it when the bytes arrive — in the reading process
(readers ``streams``, ``protocol``, against a redis-py subscriber), or in the kernel as the
bytes reach the socket (reader ``kernel``, against a plain-socket subscriber stamped the same
way).

For each N in ``--clients`` (default 1,100,1000) and each reader, the fan-out round, then one
SSE round per value of ``--processes`` (``gateway serve --processes P``; more than one lets
the scheduler place every process):
  * latency: ``--messages`` rows at ``--rate`` rows/s; p50/p99 over every (client, row);
  * fan-out: a burst of ``--burst`` rows written back to back; deliveries per second from the
    first commit to the last receipt (N * burst deliveries).
``--idle N`` first measures memory per idle stream: the serve processes' RSS before and after
N idle streams. The open-file limit is raised to the hard limit (every process started here
inherits it).

    python bench/push.py [--clients 1,100,1000] [--messages 200] [--rate 50] [--burst 200]
                         [--readers streams,protocol,kernel] [--targets fanout,sse]
                         [--processes 1[,2]] [--idle N] [--cpu-latency 0|-1]

Idle cores: by default (as root) the run holds a CPU wake-up latency limit of 0 µs
(``--cpu-latency``), so no core halts while idle. On this machine's VMs a halted core costs a
VM exit to wake, and the SSE path wakes the server's idle core where the bare subscriber,
next to Redis, finds its core awake: with ``--cpu-latency -1`` that asymmetry, not the
gateway, is a third of the 100-client p99 (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing as mp
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import ingest  # sibling bench script: its pin() and wait_http() helpers
import redis.asyncio as aioredis

from gateway import keys
from gateway.push import feed, frames
from gateway.push.protocol import FeedRow
from gateway.stores import embedded
from gateway.stores import redis as redis_clients
from gateway.stores.migrate import migrate_url
from gateway.stores.postgres import create_pool

OFFSET_RE = re.compile(rb'\ndata: \{"topic":"[^"]+","offset":(\d+),')
SIGNAL_OFFSET_RE = re.compile(rb'"offset": ?(\d+)')
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; SCM_TIMESTAMPNS is the same


# --- SSE clients (child process) ----------------------------------------------------------
# Three readers of the same bytes, each reported (the third, "kernel", is described below):
# "streams" (a task per client on asyncio
# streams: one task wake-up per client per row in the measuring process) and "protocol" (an
# asyncio.Protocol whose data_received stamps and parses at once: no task per client). With
# 100 streams in one Python process the wake-ups alone spread the receipts of one row over
# ~1 ms; the protocol reader shows how much of the p99 is the measuring side.

BENCH_ADMIN_TOKEN = "bench-admin-token"


def _request(topic: str) -> bytes:
    return (f"GET /v1/stream?topics={topic} HTTP/1.1\r\nHost: bench\r\n"
            f"Authorization: Bearer {BENCH_ADMIN_TOKEN}\r\n"
            "Accept: text/event-stream\r\n\r\n").encode()


def _check_head(head: bytes) -> None:
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(head.decode(errors="replace"))


def _scan(buf: bytes, now: float, last: int, out: list[tuple[int, float]]) -> tuple[bytes, bool]:
    """Record every complete event in ``buf``; returns the incomplete rest and whether the
    row ``last`` was seen. (Chunk-size lines between events do not disturb the match.)"""
    cut = buf.rfind(b"\n\n")
    if cut < 0:
        return buf, False
    done = False
    for match in OFFSET_RE.finditer(buf, 0, cut):
        offset = int(match.group(1))
        out.append((offset, now))
        done = done or offset >= last
    return buf[cut:], done


class _Ready:
    def __init__(self, clients: int) -> None:
        self.count, self.clients, self.event = 0, clients, asyncio.Event()

    def one(self) -> None:
        self.count += 1
        if self.count == self.clients:
            self.event.set()


async def _streams_client(port: int, topic: str, last: int, out: list[tuple[int, float]],
                          ready: _Ready) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request(topic))
    _check_head(await reader.readuntil(b"\r\n\r\n"))
    ready.one()
    buf = b""
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            buf, done = _scan(buf + data, time.perf_counter(), last, out)
            if done:
                return
    finally:
        writer.close()


class _SseProtocol(asyncio.Protocol):
    def __init__(self, topic: str, last: int, out: list[tuple[int, float]], ready: _Ready,
                 finished: asyncio.Future[None]) -> None:
        self.topic, self.last, self.out, self.ready, self.finished = (
            topic, last, out, ready, finished)
        self.buf = b""
        self.head = True
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        transport.write(_request(self.topic))

    def data_received(self, data: bytes) -> None:
        self.received(data, time.perf_counter())

    def received(self, data: bytes, now: float) -> None:
        buf = self.buf + data
        if self.head:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            try:
                _check_head(buf[:end])
            except RuntimeError as exc:
                self._finish(exc)
                return
            self.head = False
            self.ready.one()
            buf = buf[end + 4:]
        self.buf, done = _scan(buf, now, self.last, self.out)
        if done:
            self._finish(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        if not self.finished.done():
            if exc is None:
                self.finished.set_result(None)
            else:
                self.finished.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


async def _protocol_client(port: int, topic: str, last: int, out: list[tuple[int, float]],
                           ready: _Ready) -> None:
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    await asyncio.get_running_loop().create_connection(
        lambda: _SseProtocol(topic, last, out, ready, finished), "127.0.0.1", port)
    await finished


# "kernel": the time the bytes reached the client's socket, from the kernel (SO_TIMESTAMPNS on
# recvmsg), not the time the measuring process got round to reading them. 100 clients read by
# one Python process on one core are read one after another; the kernel's stamp is what a
# client on its own machine would see. Its floor is a bare subscriber stamped the same way.

def _kernel_stamp(ancillary: list[tuple[int, int, bytes]]) -> float:
    """The receive time in ``ancillary`` on the perf_counter clock (now, if there is none)."""
    mono, real = time.perf_counter(), time.time()
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
            sec, nsec = struct.unpack("qq", payload[:16])
            return mono - (real - (sec + nsec / 1e9))
    return mono


async def _kernel_socket(port: int, first: bytes,
                         on_data: Callable[[bytes, float], None]) -> socket.socket:
    """A connected socket that hands every read to ``on_data`` with its kernel stamp."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, first)

    def readable() -> None:
        try:
            data, ancillary, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(16))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, ancillary = b"", []
        if not data:
            loop.remove_reader(sock.fileno())
        on_data(data, _kernel_stamp(ancillary))

    loop.add_reader(sock.fileno(), readable)
    return sock


async def _kernel_read_until(port: int, first: bytes, on_data: Callable[[bytes, float], None],
                             finished: asyncio.Future[None]) -> None:
    """Connect, send ``first``, feed ``on_data`` until ``finished``, then close."""
    sock = await _kernel_socket(port, first, on_data)
    try:
        await finished
    finally:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(sock.fileno())
        sock.close()


async def _kernel_client(port: int, topic: str, last: int, out: list[tuple[int, float]],
                         ready: _Ready) -> None:
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    parser = _SseProtocol(topic, last, out, ready, finished)

    def on_data(data: bytes, stamp: float) -> None:
        if data:
            parser.received(data, stamp)
        else:
            parser.connection_lost(ConnectionError("server closed the stream"))

    await _kernel_read_until(port, _request(topic), on_data, finished)


READERS = {"streams": _streams_client, "protocol": _protocol_client, "kernel": _kernel_client}


def client_process(port: int, topic: str, clients: int, last: int, reader: str,
                   conn: Any) -> None:
    """Connect ``clients`` streams, report ready, collect receipts until ``last``."""
    # The receipts pile up to clients x rows tuples; a cyclic-GC pass over that heap would
    # stall the receivers and be measured as push latency. Nothing here makes cycles.
    gc.disable()
    with contextlib.suppress(ImportError):
        import uvloop
        uvloop.install()

    async def main() -> None:
        ready = _Ready(clients)
        receipts: list[list[tuple[int, float]]] = [[] for _ in range(clients)]
        tasks = []
        for i in range(clients):
            tasks.append(asyncio.create_task(
                READERS[reader](port, topic, last, receipts[i], ready)))
            if i % 50 == 49:
                await asyncio.sleep(0.01)  # pace the connects a little (listen backlog)
        try:
            await asyncio.wait_for(ready.event.wait(), 120)
        except TimeoutError:
            conn.send(f"only {ready.count} of {clients} streams connected")
            return
        conn.send("ready")
        results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [repr(r) for r in results if isinstance(r, BaseException)]
        conn.send({"receipts": receipts, "errors": errors[:5], "error_count": len(errors)})

    asyncio.run(main())


# --- bare fan-out reference (child process on the server's core) --------------------------
# What any one-process fan-out must do, and nothing more: one Python process on the same
# event loop as `gateway serve` (asyncio's default), the same redis-py subscriber of the same
# PUBLISH, each row's SSE frame encoded once (the event `gateway serve` sends, chunk-framed)
# and written to every client's transport in one loop. Its p99 is what SSE is compared with.

_BARE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
              b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")


class _FanoutConnection(asyncio.Protocol):
    """Reads the request head, answers 200, then only receives writes."""

    def __init__(self, clients: set[asyncio.Transport]) -> None:
        self.clients, self.head = clients, b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport in self.clients:
            return
        self.head += data
        if b"\r\n\r\n" in self.head:
            self.transport.write(_BARE_HEAD + frames.chunk(b": connected\n\n"))
            self.clients.add(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.clients.discard(cast(asyncio.Transport, self.transport))


def fanout_process(port: int, cache_url: str, topic: str, conn: Any) -> None:
    """Serve the bare fan-out on ``port`` for ``topic`` until SIGTERM."""
    gc.freeze()  # as `gateway serve` does once it is up

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        clients: set[asyncio.Transport] = set()
        server = await loop.create_server(lambda: _FanoutConnection(clients), "127.0.0.1",
                                          port, backlog=4096)
        cache = redis_clients.connect(cache_url, variable="bench")
        pubsub = cache.pubsub()
        await pubsub.subscribe(keys.push_channel(topic))
        conn.send("ready")
        while not stop.is_set():
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if message is None:
                continue
            row = FeedRow.from_json(json.loads(message["data"])["row"])
            data = frames.Frame(row).chunked  # once per row, whatever the number of clients
            for transport in clients:
                transport.write(data)
        server.close()
        await pubsub.aclose()
        await cache.aclose()

    asyncio.run(main())


@contextlib.contextmanager
def bare_fanout(port: int, cache_url: str, topic: str, core: int) -> Iterator[int]:
    parent, child = mp.Pipe()
    proc = mp.Process(target=fanout_process, args=(port, cache_url, topic, child))
    proc.start()
    pin(cast(int, proc.pid), core)
    try:
        if not parent.poll(30) or parent.recv() != "ready":
            raise SystemExit("bench: the bare fan-out process did not start")
        yield cast(int, proc.pid)
    finally:
        proc.terminate()
        proc.join(10)


# --- writer and bare subscriber (this process) --------------------------------------------

async def bare_subscriber(cache_url: str, topic: str, last: int,
                          out: list[tuple[int, float]], ready: asyncio.Event) -> None:
    client = aioredis.from_url(cache_url, decode_responses=True, protocol=2)
    pubsub = client.pubsub()
    await pubsub.subscribe(keys.push_channel(topic))
    ready.set()
    try:
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
            if message is None:
                continue
            now = time.perf_counter()
            offset = json.loads(message["data"])["offset"]
            out.append((offset, now))
            if offset >= last:
                return
    finally:
        await pubsub.aclose()
        await client.aclose()


async def bare_kernel_subscriber(cache_url: str, topic: str, last: int,
                                 out: list[tuple[int, float]], ready: asyncio.Event) -> None:
    """The floor of the "kernel" reader: RESP SUBSCRIBE on a plain socket, each message
    stamped with its kernel receive time (see ``_kernel_stamp``)."""
    url = urlsplit(cache_url)
    channel = keys.push_channel(topic)
    first = b""
    if url.password:
        first += _resp("AUTH", url.username or "default", url.password)
    first += _resp("SUBSCRIBE", channel)
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: set[int] = set()
    buf = b""

    def on_data(data: bytes, stamp: float) -> None:
        nonlocal buf
        if not data:
            if not done.done():
                done.set_exception(ConnectionError("redis-cache closed the subscriber"))
            return
        buf += data
        if not ready.is_set() and b"subscribe" in buf:
            ready.set()
        cut = buf.rfind(b"}")  # messages end with their JSON; a partial one waits
        for match in SIGNAL_OFFSET_RE.finditer(buf, 0, cut + 1):
            offset = int(match.group(1))
            if offset not in seen:
                seen.add(offset)
                out.append((offset, stamp))
                if offset >= last and not done.done():
                    done.set_result(None)
        buf = buf[cut + 1:]

    await _kernel_read_until(url.port or 6379, first, on_data, done)


def _resp(*parts: str) -> bytes:
    encoded = [part.encode() for part in parts]
    return b"*%d\r\n" % len(encoded) + b"".join(
        b"$%d\r\n%b\r\n" % (len(part), part) for part in encoded)


async def write_rows(pool: Any, cache: Any, topic: str, first: int, count: int, rate: float | None,
                     commits: dict[int, float]) -> None:
    start = time.perf_counter()
    for i in range(count):
        if rate:
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        async with pool.acquire() as conn, conn.transaction():
            row = await feed.append(conn, topic, "bench", {"i": first + i})
        commits[row.offset] = time.perf_counter()
        await feed.publish(cache, row)


def percentiles(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    values = sorted(values)
    return (values[len(values) // 2] * 1000,
            values[min(len(values) - 1, int(len(values) * 0.99))] * 1000)


async def run_round(args: argparse.Namespace, port: int, cache_url: str, pg_url: str,
                    clients: int, reader: str, target: str,
                    server_pids: list[int] | None = None) -> dict[str, Any]:
    """One round: ``clients`` streams of ``target`` (``sse``: the gateway on ``port``, whose
    processes are ``server_pids``; ``fanout``: a bare fan-out process started for the round),
    the bare subscriber beside."""
    topic = f"bench.{clients}.{reader}.{target}.{int(time.time())}"
    if target == "sse":
        return await _measure(args, port, cache_url, pg_url, clients, reader, topic,
                              server_pids or [])
    fanout_port = embedded.free_port()
    with bare_fanout(fanout_port, cache_url, topic, args.server_core) as pid:
        return await _measure(args, fanout_port, cache_url, pg_url, clients, reader, topic,
                              [pid])


async def _measure(args: argparse.Namespace, port: int, cache_url: str, pg_url: str,
                   clients: int, reader: str, topic: str,
                   server_pids: list[int]) -> dict[str, Any]:
    total = args.messages + args.burst
    parent, child = mp.Pipe()
    proc = mp.Process(target=client_process, args=(port, topic, clients, total, reader, child))
    proc.start()
    pin(proc.pid, args.load_core)
    pool = await create_pool(pg_url, max_size=4)
    cache = aioredis.from_url(cache_url, decode_responses=True, protocol=2)
    bare: list[tuple[int, float]] = []
    bare_ready = asyncio.Event()
    try:
        loop = asyncio.get_running_loop()
        status = await loop.run_in_executor(None, parent.recv)
        if status != "ready":
            raise SystemExit(f"bench: client process: {status}")
        subscriber = bare_kernel_subscriber if reader == "kernel" else bare_subscriber
        bare_task = asyncio.create_task(subscriber(cache_url, topic, total, bare, bare_ready))
        await bare_ready.wait()
        commits: dict[int, float] = {}
        cpu_start = sum(ingest.cpu_seconds(pid) for pid in server_pids)
        await write_rows(pool, cache, topic, 0, args.messages, args.rate, commits)
        burst_start = time.perf_counter()
        await write_rows(pool, cache, topic, args.messages, args.burst, None, commits)
        result = await loop.run_in_executor(None, parent.recv)
        cpu = sum(ingest.cpu_seconds(pid) for pid in server_pids) - cpu_start
        await asyncio.wait_for(bare_task, 30)
    finally:
        await pool.close()
        await cache.aclose()
        proc.join(30)
    receipts = result["receipts"]
    lat_sse = [t - commits[o] for r in receipts for o, t in r if o <= args.messages]
    lat_bare = [t - commits[o] for o, t in bare if o <= args.messages]
    burst_sse = [t for r in receipts for o, t in r if o > args.messages]
    burst_bare = [t for o, t in bare if o > args.messages]
    delivered = sum(len(r) for r in receipts)
    return {
        "clients": clients,
        "sse": percentiles(lat_sse), "bare": percentiles(lat_bare),
        "sse_fanout": len(burst_sse) / (max(burst_sse) - burst_start) if burst_sse else 0.0,
        "bare_fanout": len(burst_bare) / (max(burst_bare) - burst_start) if burst_bare else 0.0,
        "missing": clients * total - delivered, "errors": result["error_count"],
        # The server's CPU over the round per row delivered to a client: its unit cost.
        "cpu_us": cpu / delivered * 1e6 if delivered else float("nan"),
        "error_sample": result["errors"],
    }


def round_line(reader: str, clients: int, processes: int, fan: dict[str, Any] | None,
               sse: dict[str, Any] | None) -> str:
    """One table line: the subscriber floor, the fan-out and SSE latencies, their ratios."""
    nan = float("nan")
    sub99 = (sse or fan or {"bare": (nan, nan)})["bare"][1]
    f99 = fan["sse"][1] if fan else nan
    s50, s99 = sse["sse"] if sse else (nan, nan)
    missing = "/".join(str(r["missing"]) for r in (fan, sse) if r is not None)
    return (f"{reader:>8} {clients:>7} {processes or '-':>5} {sub99:>6.2f}ms {f99:>6.2f}ms "
            f"{s50:>6.2f}ms {s99:>6.2f}ms {s99 / f99:>6.2f}x {s99 / sub99:>6.2f}x "
            f"{fan['sse_fanout'] if fan else nan:>11.0f} "
            f"{sse['sse_fanout'] if sse else nan:>11.0f} "
            f"{fan['cpu_us'] if fan else nan:>6.1f} {sse['cpu_us'] if sse else nan:>6.1f} "
            f"{missing:>7}")


def report_errors(what: str, result: dict[str, Any]) -> None:
    if result["errors"]:
        print(f"        {what}: {result['errors']} client errors, e.g. {result['error_sample']}")


# --- memory per idle stream -------------------------------------------------------------------

def serve_command(args: argparse.Namespace, processes: int) -> list[str]:
    cmd = [sys.executable, "-m", "gateway.cli", "serve"]
    if processes > 1:
        cmd += ["--processes", str(processes)]
    if shutil.which("taskset") and args.server_core >= 0:
        cmd[:0] = ["taskset", "-c", str(args.server_core)]
    return cmd


def serve_pids(pid: int, processes: int) -> list[int]:
    """The processes that hold the streams: the serve itself, or the supervisor's children
    (waited for: they start after it)."""
    if processes == 1:
        return [pid]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children = [int(c) for c in
                    Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        if len(children) == processes:
            return children
        time.sleep(0.1)
    raise SystemExit(f"bench: the supervisor did not start {processes} serve processes")


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def measure_idle(args: argparse.Namespace, port: int, clients: int,
                 pids: list[int]) -> tuple[int, int]:
    """RSS in KiB of the serve processes before and after ``clients`` idle streams of one
    topic (the kernel reader, nothing written), two seconds after the last connected. (The
    kernel's own per-socket memory is not in it.)"""
    time.sleep(2.0)  # the serve's own start-up allocations settle
    rss_before = rss_kib(pids)
    parent, child = mp.Pipe()
    proc = mp.Process(target=client_process,
                      args=(port, f"idle.{int(time.time())}", clients, 1, "kernel", child))
    proc.start()
    pin(cast(int, proc.pid), args.load_core)
    try:
        if not parent.poll(300) or parent.recv() != "ready":
            raise SystemExit("bench: the idle streams did not all connect")
        time.sleep(2.0)  # heartbeats and housekeeping have run over every stream
        return rss_before, rss_kib(pids)
    finally:
        proc.terminate()
        proc.join(30)


def idle_line(processes: int, clients: int, figures: tuple[int, int]) -> str:
    rss_before, rss_after = figures
    per = (rss_after - rss_before) / clients
    return (f"idle streams: {clients} on {processes} serve process(es): RSS {rss_before} -> "
            f"{rss_after} KiB, {per:.1f} KiB per stream (target <= 20)")


# --- plumbing -------------------------------------------------------------------------------

def pin(pid: int, core: int) -> None:
    if core >= 0:  # a negative core: --no-pin
        ingest.pin(pid, core)


@contextlib.contextmanager
def gateway_server(cmd: list[str], env: dict[str, str],
                   log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``gateway serve`` for the length of the block; its output goes to ``log``."""
    with log.open("wb") as out:
        server = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield server
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def hold_cpu_latency(microseconds: int) -> Any:
    """Linux PM QoS: while the returned file stays open, no core enters an idle state whose
    wake-up takes longer than ``microseconds``. On this machine's VMs (cpuidle driver
    ``haltpoll``) 0 means idle cores poll instead of halting, so a wake-up costs no VM exit.
    It applies to every process, the bare subscriber's as much as the gateway's; what
    ``tuned``'s latency-performance profile does for latency-sensitive services."""
    try:
        handle = open("/dev/cpu_dma_latency", "wb", buffering=0)
        handle.write(struct.pack("i", microseconds))
    except OSError as exc:
        print(f"bench: CPU wake-up latency left alone: /dev/cpu_dma_latency: {exc}")
        return None
    return handle


def raise_fd_limit(needed: int) -> None:
    """Soft open-file limit up to the hard one (inherited by every process started here:
    the server and the client process each hold one descriptor per stream)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        raise SystemExit(f"bench: ulimit -n is {soft}; need about {needed}")


def stream_caps_config(root: Path, clients: int) -> Path:
    """A GATEWAY_CONFIG that lets every bench stream in: they all come from 127.0.0.1, past
    the per-client stream and connection caps (their own tests are in tests/push, tests/web)."""
    path = root / "gateway.toml"
    path.write_text(f"[push]\nmax_streams_per_client = {clients + 16}\n"
                    f"max_streams = {clients + 16}\n"
                    f"[connections]\nper_ip = {clients + 64}\nmax = {clients + 256}\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,100,1000")
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--readers", default="streams,protocol,kernel",
                        help="SSE readers in the measuring process, each a round per N")
    parser.add_argument("--targets", default="fanout,sse",
                        help="what the clients read: fanout (the bare fan-out reference), "
                             "sse (gateway serve); a round each per reader and N")
    parser.add_argument("--processes", default="1",
                        help="serve processes for the SSE rounds (gateway serve --processes), "
                             "a round each; more than one implies --no-pin")
    parser.add_argument("--idle", type=int, default=0, metavar="N",
                        help="first measure memory per idle stream: RSS of the serve "
                             "process(es) before and after N idle streams, for each --processes")
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--load-core", type=int, default=1)
    parser.add_argument("--no-pin", action="store_true",
                        help="let the scheduler place every process (on a shared machine)")
    parser.add_argument("--cpu-latency", type=int, metavar="US", default=0,
                        help="hold this CPU wake-up latency limit in µs for the whole run "
                             "(/dev/cpu_dma_latency; default 0: idle cores poll instead of "
                             "halting, for every process alike; skipped when not root); "
                             "-1: leave the machine's idle policy alone")
    args = parser.parse_args()
    process_counts = [int(n) for n in args.processes.split(",")]
    if max(process_counts) > 1:
        args.no_pin = True  # two serve processes pinned to one core would share it
    if args.no_pin:
        args.server_core = args.load_core = -1
    counts = [int(c) for c in args.clients.split(",") if c]
    readers = args.readers.split(",")
    if not set(readers) <= set(READERS):
        parser.error(f"--readers: choose from {', '.join(READERS)}")
    targets = args.targets.split(",")
    if not set(targets) <= {"fanout", "sse"}:
        parser.error("--targets: choose from fanout, sse")
    gc.disable()  # same for the bare subscriber's side (see client_process)
    raise_fd_limit(max([*counts, args.idle]) + 256)

    qos = hold_cpu_latency(args.cpu_latency) if args.cpu_latency >= 0 else None
    root = Path(tempfile.mkdtemp(prefix="gwp-"))
    servers: list[embedded.RedisServer | embedded.PostgresServer] = []
    try:
        durable = embedded.RedisServer("durable", root / "durable", embedded.new_password()).start()
        cache = embedded.RedisServer("cache", root / "cache", embedded.new_password()).start()
        servers += [durable, cache]
        pg = embedded.PostgresServer(root / "pg" / "data").start()
        servers.append(pg)
        for server in (durable, cache):
            assert server.proc is not None
            pin(server.proc.pid, args.load_core)
        pin(os.getpid(), args.load_core)
        asyncio.run(migrate_url(pg.url))
        port = embedded.free_port()
        env = {**os.environ, "GATEWAY_DURABLE_URL": durable.url, "GATEWAY_CACHE_URL": cache.url,
               "GATEWAY_DATABASE_URL": pg.url, "GATEWAY_HOST": "127.0.0.1",
               "GATEWAY_PORT": str(port), "GATEWAY_LOG_LEVEL": "WARNING",
               "GATEWAY_ADMIN_TOKEN": BENCH_ADMIN_TOKEN,
               "GATEWAY_CONFIG": str(stream_caps_config(root, max([*counts, args.idle])))}
        placement = ("no pinning" if args.no_pin else
                     f"server on core {args.server_core}; stores, writer, bare subscriber and "
                     f"SSE clients on core {args.load_core}")
        placement += (f"; CPU wake-up latency held at {args.cpu_latency} µs" if qos is not None
                      else "; the machine's own CPU idle policy")
        print(f"{placement}; {os.cpu_count()} cores; "
              f"{args.messages} rows at {args.rate:g}/s, then a burst of {args.burst}")
        if args.idle:
            for processes in process_counts:
                with gateway_server(serve_command(args, processes), env,
                                    root / f"gateway-idle-{processes}.log") as server:
                    ingest.wait_http(f"http://127.0.0.1:{port}/healthz")
                    print(idle_line(processes, args.idle, measure_idle(
                        args, port, args.idle, serve_pids(server.pid, processes))), flush=True)
        if not counts:
            return 0
        print(f"{'reader':>8} {'clients':>7} {'procs':>5} {'sub p99':>8} {'fan p99':>8} "
              f"{'sse p50':>8} {'sse p99':>8} {'sse/fan':>7} {'sse/sub':>7} "
              f"{'fan deliv/s':>11} {'sse deliv/s':>11} {'fan µs':>6} {'sse µs':>6} "
              f"{'missing':>7}")
        for clients, reader in ((c, name) for c in counts for name in readers):
            fan = None
            if "fanout" in targets:
                fan = asyncio.run(run_round(args, 0, cache.url, pg.url, clients, reader,
                                            "fanout"))
                report_errors("fanout", fan)
            for processes in process_counts if "sse" in targets else []:
                with gateway_server(serve_command(args, processes), env,
                                    root / f"gateway-{processes}.log") as server:
                    ingest.wait_http(f"http://127.0.0.1:{port}/healthz")
                    sse = asyncio.run(run_round(args, port, cache.url, pg.url, clients,
                                                reader, "sse",
                                                serve_pids(server.pid, processes)))
                print(round_line(reader, clients, processes, fan, sse), flush=True)
                report_errors(f"sse x{processes}", sse)
            if "sse" not in targets and fan is not None:
                print(round_line(reader, clients, 0, fan, None), flush=True)
    finally:
        embedded.stop_all(servers)
        shutil.rmtree(root, ignore_errors=True)
        if qos is not None:
            qos.close()  # the limit ends with the file
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
