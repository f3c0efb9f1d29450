"""Schemathesis against a running ``gateway serve`` (real Redis and PostgreSQL), driven by
the document the server itself serves at ``/v1/openapi.json``: every operation, a fixed
example budget and seed. Any 5xx, or an answer whose status, media type, headers or body the
document does not give, fails the run. Each operation is called with the credential a client
would use: the ``gateway dev`` client token where its scopes allow, the admin token elsewhere;
signed webhooks are signed (``schemathesis_hooks.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.access.tokens import mint
from gateway.app.dev import CLIENT_SCOPES
from gateway.stores.embedded import free_port
from tests.conftest import (
    TEST_ADMIN_TOKEN,
    TEST_WEBHOOK_SOURCES,
    ServerSet,
    reset_stores,
)

ROOT = Path(__file__).resolve().parents[2]
JWT_SECRET = "schemathesis-jwt-secret-0123456789abcdef"
EXAMPLES = 8           # per operation and phase: the budget
SEED = 1
CLIENT_TOPICS = ("pipeline", "conversation:*")
# Refused credentials and bad signatures are what a fuzzer sends; counted, they would block
# this address after ten and leave every later call a 429.
CONFIG = '[security]\nnever_block = ["127.0.0.0/8"]\n'


@pytest.fixture
def stack(servers: ServerSet, tmp_path: Path) -> Iterator[str]:
    """The URL of a ``gateway serve`` process on the session's stores (emptied first)."""
    asyncio.run(reset_stores(servers))
    (tmp_path / "gateway.toml").write_text(CONFIG)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(GATEWAY_DURABLE_URL=servers.durable_url, GATEWAY_CACHE_URL=servers.cache_url,
               GATEWAY_DATABASE_URL=servers.database_url, GATEWAY_PORT=str(port),
               GATEWAY_ADMIN_TOKEN=TEST_ADMIN_TOKEN, GATEWAY_JWT_SECRET=JWT_SECRET,
               GATEWAY_WEBHOOK_SECRETS=TEST_WEBHOOK_SOURCES,
               GATEWAY_CONFIG=str(tmp_path / "gateway.toml"))
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve"], env=env,
                              cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _ready(url):
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "gateway serve was not ready in 60 s"
            time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _settings(document: dict, admin: str, client: str) -> str:
    """The run's configuration: the client token by default, the admin token for the
    operations whose scope the client token lacks. A stream that opens sends nothing until a
    row or its heartbeat, so each is read for 2 s, and only for a few cases (its coverage
    phase, some thirty streams, would take most of the run; tests/web/test_malformed.py
    sends it the boundary cases)."""
    by_admin = [op["operationId"] for item in document["paths"].values()
                for op in item.values()
                if (scopes := {s for need in op["security"] for v in need.values() for s in v})
                and not scopes <= CLIENT_SCOPES]
    return f"""
seed = {SEED}
workers = 1
request-timeout = 10
max-stream-events = 1
headers = {{ Authorization = "Bearer {client}" }}
hooks = "tests.api.schemathesis_hooks"

[output.truncation]
enabled = true

[parameters]
"path.source" = "demo"

[checks]
enabled = false
not_a_server_error.enabled = true
status_code_conformance.enabled = true
content_type_conformance.enabled = true
response_headers_conformance.enabled = true
response_schema_conformance.enabled = true

[generation]
max-examples = {EXAMPLES}

[[operations]]
include-operation-id = {json.dumps(by_admin)}
headers = {{ Authorization = "Bearer {admin}" }}

[[operations]]
include-operation-id = "get_v1_stream"
request-timeout = 2
generation.max-examples = 4
phases.coverage.enabled = false
"""


@pytest.mark.timeout(300)  # about 15 s alone; a machine shared with other runs takes longer
def test_no_5xx_and_no_answer_off_the_document(stack: str, tmp_path: Path) -> None:
    with urllib.request.urlopen(stack + "/v1/openapi.json") as answer:
        document = json.load(answer)
    operations = sum(len(item) for item in document["paths"].values())
    client = mint(JWT_SECRET, "schemathesis", CLIENT_SCOPES, CLIENT_TOPICS, 3600)
    config = tmp_path / "schemathesis.toml"
    config.write_text(_settings(document, TEST_ADMIN_TOKEN, client))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "--no-color",
         "run", stack + "/v1/openapi.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    report = run.stdout + run.stderr
    print(report)  # shown with -s
    assert run.returncode == 0, report[-6000:]
    # Every operation but the document's own, which Schemathesis leaves out of a run it
    # loads from it (tests/api/test_openapi.py checks that one).
    tested = re.search(r"Tested: (\d+)", report)
    assert tested and int(tested.group(1)) == operations - 1, report[-3000:]
