"""The README's examples run as written (issue 28 point 4): every shell and Python block, in
order, against one ``gateway dev`` stack started in a fresh folder, with only the variables
the README itself sets (a shell block's assignments carry over to the next blocks). A block
that cannot run here says so with a marker (``tests/readme_blocks.py``).

How a block is run: shell blocks by ``bash`` with ``set -euo pipefail`` (an unset variable
or a failing command fails the block) and ``set -a`` (assignments are exported to the next
blocks); ``curl`` fails on an HTTP error (``--fail-with-body``), and a stream (``curl -N``)
is followed for 2 s; Python blocks by this interpreter. ``localhost:8080`` and
``127.0.0.1:8080`` are the stack's port. A block fails on a non-zero exit or a traceback;
the failure names its README line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.stores.embedded import free_port
from tests.app.test_dev import _env, _run_dev, _stop
from tests.readme_blocks import Block, MarkerError, blocks, readme_blocks

pytestmark = pytest.mark.slow

BLOCK_SECONDS = 120.0
CURL = r"""
curl() {  # README curl lines: an HTTP error fails the block; a stream is followed for 2 s
  local arg rc=0
  for arg in "$@"; do
    case "$arg" in -N|-sN|-Ns|--no-buffer)
      command curl --fail-with-body --max-time 2 "$@" || rc=$?
      echo
      [ "$rc" = 28 ] && return 0
      return "$rc";;
    esac
  done
  command curl --fail-with-body --max-time 30 "$@"; rc=$?; echo; return "$rc"
}
"""
NOT_CARRIED = {"_", "SHLVL", "PWD", "OLDPWD"}


def _script(block: Block, port: int, state: Path) -> str:
    code = block.code.replace("localhost:8080", f"localhost:{port}").replace(
        "127.0.0.1:8080", f"127.0.0.1:{port}")
    if block.language == "python":
        return code
    return (f"set -euo pipefail\n{CURL}\nset -a\n{code}\nset +a\n"
            f"env -0 > {state}\n")


def _carried(state: Path) -> dict[str, str]:
    pairs = (entry.split("=", 1) for entry in state.read_bytes().decode().split("\0") if entry)
    return {k: v for k, v in pairs if k not in NOT_CARRIED}


def _run(block: Block, env: dict[str, str], cwd: Path, port: int) -> dict[str, str]:
    """Run one block; the environment the next block starts from."""
    state = cwd / ".readme-env"
    state.unlink(missing_ok=True)
    script = _script(block, port, state)
    command = (["bash", "-c", script] if block.language == "sh"
               else [sys.executable, "-c", script])
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=block.follow or BLOCK_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        if block.follow is None:
            pytest.fail(f"{block.name()} still running after {BLOCK_SECONDS:g} s:\n{out}")
        proc.returncode = 0  # followed as long as the marker says: it was still running
    if proc.returncode != 0 or "Traceback (most recent call last)" in out:
        pytest.fail(f"{block.name()} failed (exit {proc.returncode}):\n{block.code}\n"
                    f"--- output ---\n{out}")
    return {**env, **_carried(state)} if state.exists() else env


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gwreadme-"))  # not under pytest's 0700 basetemp
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_every_readme_example_runs_in_order_against_gateway_dev(workdir: Path) -> None:
    port = free_port()
    runnable = [b for b in readme_blocks() if b.skip is None]
    assert len(runnable) >= 10, "the README has lost its examples, or the extractor its way"
    proc, _url = _run_dev(workdir, port)
    env = {k: v for k, v in _env(port).items() if k != "GATEWAY_PORT"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    started = time.monotonic()
    try:
        for block in runnable:
            env = _run(block, env, workdir, port)
    finally:
        out = _stop(proc)
    assert "Traceback" not in out, f"gateway dev logged a traceback:\n{out}"
    assert time.monotonic() - started < 240


def test_the_extractor_finds_blocks_markers_and_lines() -> None:
    text = "\n".join([
        "# t", "```sh", "echo one", "```", "",
        "<!-- readme-test: skip: production servers -->", "", "```bash", "echo two", "```",
        "<!-- readme-test: follow 5 -->", "```python", "print(3)", "```",
        "```toml", "a = 1", "```", "````sh", "echo ```", "````"])
    found = blocks(text)
    assert [(b.line, b.language, b.skip, b.follow) for b in found] == [
        (2, "sh", None, None), (8, "sh", "production servers", None),
        (12, "python", None, 5.0), (18, "sh", None, None)]
    assert found[0].code == "echo one\n" and found[3].code == "echo ```\n"
    assert found[2].name() == "README.md line 12 (python block)"
    with pytest.raises(MarkerError, match="needs its reason"):
        blocks("<!-- readme-test: skip -->\n```sh\nx\n```")
    with pytest.raises(MarkerError, match="unreadable"):
        blocks("<!-- readme-test: sometimes -->\n```sh\nx\n```")
