"""SIGTERM on a real `gateway worker`: finished items complete, a stuck one is released after
the grace period, the process exits 0 and nothing is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from gateway.pipeline import queue
from gateway.pipeline.stages import deadline_key
from gateway.pipeline.status import queue_depths
from tests.helpers import wait_until


async def test_sigterm_releases_in_flight_items(runtime, servers, tmp_path):
    config = tmp_path / "gateway.toml"
    config.write_text('[pipeline]\nshutdown_grace_seconds = 0.5\n\n[pipeline.handlers]\n'
                      'chunk = "tests.pipeline.slow_handlers:chunk_forever"\n')
    env = {**os.environ, "GATEWAY_DURABLE_URL": servers.durable_url,
           "GATEWAY_CACHE_URL": servers.cache_url, "GATEWAY_DATABASE_URL": servers.database_url,
           "GATEWAY_CONFIG": str(config)}
    await queue.enqueue(runtime.durable, "a", {"text": "hello"})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "worker", "--stages", "store,chunk",
        "--concurrency", "1", env=env, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        await wait_until(lambda: runtime.durable.zcard(deadline_key("chunk")), timeout=20,
                         message="the item leased at chunk")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 20)
    assert code == 0
    depths = await queue_depths(runtime.durable)
    assert depths["stages"]["chunk"] == {"ready": 1, "inflight": 0, "delayed": 0, "dead": 0}
    lease = await queue.fetch(runtime.durable, "chunk", "w", 60_000)
    assert lease is not None and lease.failures == 0 and lease.reclaims == 0
    journal = await runtime.pg.fetch("SELECT stage FROM pipeline_journal WHERE item_id = 'a'")
    assert [r["stage"] for r in journal] == ["store"]
