"""The supervisor tells a failed start from a later failure by the child's readiness pipe,
not by a clock: stand-in children (small Python programs given the same ``--ready-fd``)
show each side without starting serve processes."""

from __future__ import annotations

import sys
import threading

import pytest

from gateway.app import supervisor
from gateway.app.supervisor import Supervisor

# Exits 3, after telling the supervisor it listens when "ready" is its first argument.
CHILD = """
import os, sys
if sys.argv[1] == "ready":
    os.write(int(sys.argv[sys.argv.index("--ready-fd") + 1]), b"1")
sys.exit(3)
"""


class StandIn(Supervisor):
    def __init__(self, mode: str) -> None:
        super().__init__("127.0.0.1", 0, 1)
        self.mode = mode
        self.spawned = 0

    def argv(self, index: int) -> list[str]:
        self.spawned += 1
        if self.spawned >= 3:  # replaced twice: enough, end the run
            self.stop.set()
        return [sys.executable, "-c", CHILD, self.mode]


def run_briefly(standin: StandIn, monkeypatch: pytest.MonkeyPatch) -> int:
    """``run`` in a thread, with a deadline; the signal handlers it installs need the main
    thread, so they are skipped here."""
    result: list[int] = []
    monkeypatch.setattr(supervisor.signal, "signal", lambda *_: None)
    thread = threading.Thread(target=lambda: result.append(standin.run()))
    thread.start()
    thread.join(30)
    assert result, "the supervisor did not return within 30 s"
    return result[0]


def test_a_child_that_ends_before_it_listens_failed_to_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    standin = StandIn("silent")
    assert run_briefly(standin, monkeypatch) == 3  # its status is the supervisor's
    assert standin.spawned == 1  # not replaced


def test_a_child_that_ends_after_it_listened_is_replaced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    standin = StandIn("ready")
    run_briefly(standin, monkeypatch)
    assert standin.spawned >= 3  # replaced each time, however soon it ended
