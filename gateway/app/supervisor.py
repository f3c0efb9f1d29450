"""``gateway serve --processes N``: N ``gateway serve --reuse-port`` processes on one port
under a supervisor that only starts, restarts and stops them.

Each child binds the port with ``SO_REUSEPORT``, so the kernel spreads new connections over
their listening sockets (by the connection's addresses: SSE clients and webhooks alike), and
each is a whole serve process: its own hub, pools, readiness and background services, none
of which decides an outcome alone (docs/architecture.md, "Scale-out"), so N of them on one
host are as safe as N replicas. On SIGTERM or SIGINT the supervisor passes SIGTERM to every
child, which stops as a single serve does (``/readyz`` 503, socket closed, streams told
``shutdown``, requests finished), and waits for all of them. A child that exits with an
error status before it listens failed to start (a refused topology, a bad configuration):
the others are stopped and its status is the supervisor's. Each child tells that it listens
by one byte on a pipe of its own (``--ready-fd``), so a slow start on a busy machine is
still a start, however long it takes. Any other end of a child (killed, or failing after it
listened) is replaced after ``RESTART_DELAY_SECONDS``. A
child gets SIGTERM when the supervisor dies, however it dies (Linux), so none outlives it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import FrameType

log = logging.getLogger("gateway.serve")

RESTART_DELAY_SECONDS = 1.0
# A child's own stop takes at most its request grace plus its services' (serve.py); past
# this the supervisor kills what is left.
STOP_SECONDS = 60.0


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the supervisor dies, even by SIGKILL,
    so no serve process outlives it unsupervised; elsewhere nothing."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def _reserve_port(host: str) -> socket.socket:
    """A socket bound (not listening) with SO_REUSEPORT to a free port: the port every child
    binds, held for the supervisor's lifetime so nothing else takes it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, 0))
    return sock


class Supervisor:
    def __init__(self, host: str, port: int, processes: int, *,
                 telegram_polling: bool = False) -> None:
        self.host, self.port, self.processes = host, port, processes
        self.telegram_polling = telegram_polling
        self.stop = threading.Event()
        self.children: list[subprocess.Popen[bytes]] = []
        self.ready: list[_ReadyPipe] = []

    def argv(self, index: int) -> list[str]:
        argv = [sys.executable, "-m", "gateway.cli", "serve", "--reuse-port",
                "--host", self.host, "--port", str(self.port)]
        if self.telegram_polling and index == 0:
            argv.append("--telegram-polling")  # Telegram allows one poller per bot
        return argv

    def _spawn(self, index: int) -> tuple[subprocess.Popen[bytes], _ReadyPipe]:
        read_end, write_end = os.pipe()
        try:
            child = subprocess.Popen([*self.argv(index), "--ready-fd", str(write_end)],
                                     pass_fds=(write_end,), preexec_fn=_die_with_parent)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        log.info("serve process %d started (pid %d)", index, child.pid)
        return child, _ReadyPipe(read_end)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop.set()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for index in range(self.processes):
            child, ready = self._spawn(index)
            self.children.append(child)
            self.ready.append(ready)
        log.info("supervising %d serve processes on http://%s:%d", self.processes,
                 self.host, self.port)
        failed = 0
        while not self.stop.wait(0.2):
            failed = self._check_children()
            if failed:
                break
        return self._stop_all() if not failed else max(failed, self._stop_all())

    def _check_children(self) -> int:
        """Replace a child that ended; the exit status of one that failed to start (then
        everything stops)."""
        for index, child in enumerate(self.children):
            code = child.poll()
            if code is None or self.stop.is_set():
                continue
            if code > 0 and not self.ready[index].told():
                log.error("serve process %d (pid %d) ended during start-up (status %s); "
                          "stopping the others", index, child.pid, code)
                return code or 1
            log.warning("serve process %d (pid %d) ended (status %s); starting another",
                        index, child.pid, code)
            if self.stop.wait(RESTART_DELAY_SECONDS):
                return 0
            self.ready[index].close()
            self.children[index], self.ready[index] = self._spawn(index)
        return 0

    def _stop_all(self) -> int:
        """SIGTERM every child, wait for each (``STOP_SECONDS`` in all, then SIGKILL);
        0 when all stopped cleanly."""
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        worst = 0
        for child in self.children:
            try:
                code = child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("serve process pid %d did not stop in time; killing it", child.pid)
                child.kill()
                code = child.wait()
            # A child stopped by our SIGTERM before its handler was installed ends -SIGTERM.
            if code not in (0, -signal.SIGTERM):
                worst = max(worst, 1)
        for ready in self.ready:
            ready.close()
        log.info("all %d serve processes stopped", len(self.children))
        return worst


class _ReadyPipe:
    """The supervisor's end of a child's readiness pipe: the child writes one byte once it
    listens (``gateway serve --ready-fd``)."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd
        self.listened = False
        os.set_blocking(fd, False)

    def told(self) -> bool:
        """The child said it listens (read without waiting: its byte, if sent, is in the
        pipe even after the child ended)."""
        if not self.listened and self.fd is not None:
            with contextlib.suppress(BlockingIOError):
                self.listened = os.read(self.fd, 1) == b"1"
        return self.listened

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def run(host: str, port: int, processes: int, *, telegram_polling: bool = False) -> int:
    reserved = _reserve_port(host) if port == 0 else None
    try:
        if reserved is not None:
            port = reserved.getsockname()[1]
        return Supervisor(host, port, processes, telegram_polling=telegram_polling).run()
    finally:
        if reserved is not None:
            reserved.close()
