"""The restore runbook, end to end, as an operator runs it: maintenance on → pg_restore of a
backup taken earlier → ``gateway recover --reset`` → maintenance off. Items finished before
the backup do not run again; items that moved on after it run the stages the restored
database lost; items still waiting for their first stage keep their payload; conversations
and the feed are what the backup held, and the feed's offsets go on from there."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from gateway.conversations.service import Incoming, handle_incoming
from gateway.pipeline import queue
from gateway.pipeline.stages import STAGES, inflight_key
from gateway.stores import embedded
from gateway.stores.runtime import Runtime
from tests.conftest import ServerSet
from tests.helpers import gateway_cli, wait_until
from tests.pipeline.helpers import workers


async def graphs(runtime: Runtime) -> int:
    return int(await runtime.pg.fetchval(
        "SELECT count(*) FROM pipeline_journal WHERE stage = 'graph'"))


async def enqueue(runtime: Runtime, prefix: str, count: int) -> list[str]:
    """Submit ``count`` new items; each must be accepted (not refused as a duplicate)."""
    ids = [f"{prefix}{n}" for n in range(count)]
    for item in ids:
        assert await queue.enqueue(runtime.durable, item, {"text": f"document {item} #r"})
    return ids


def pg_tool(name: str, *args: str) -> None:
    subprocess.run([str(embedded._pg_bin_dir() / name), *args], check=True,
                   capture_output=True, timeout=120)


async def cli(servers: ServerSet, *args: str) -> str:
    code, out, err = await gateway_cli(servers, *args)
    assert code == 0, err
    return out


async def test_the_restore_runbook(runtime: Runtime, servers: ServerSet,
                                   tmp_path: Path) -> None:
    backup = tmp_path / "gateway.dump"

    async def send(text: str) -> None:
        return None

    before = await enqueue(runtime, "a", 8)
    async with workers(runtime):
        await wait_until(lambda: _at_least(runtime, 8), timeout=30, message="a-items done")
    await handle_incoming(runtime, Incoming(platform="telegram", chat="42", thread=None,
                                            user_id="u", user_name="user", text="kept?",
                                            message_id="1"), send)
    journal_before = await runtime.pg.fetch(
        "SELECT item_id, stage, completed_at FROM pipeline_journal ORDER BY 1, 2")
    pg_tool("pg_dump", "-Fc", "-d", servers.database_url, "-f", str(backup))

    after = await enqueue(runtime, "b", 8)  # finished after the backup: the restore undoes it
    async with workers(runtime):
        await wait_until(lambda: _at_least(runtime, 16), timeout=30, message="b-items done")
    waiting = await enqueue(runtime, "c", 8)  # still waiting for their first stage

    await cli(servers, "maintenance", "on", "--reason", "restore from backup")
    pg_tool("pg_restore", "--clean", "--if-exists", "-d", servers.database_url, str(backup))
    await runtime.pg.expire_connections()  # the tables were dropped and created again
    assert await graphs(runtime) == 8
    out = await cli(servers, "recover", "--reset")
    assert "reset: 8 items back" in out  # the c-items, with their payloads
    # The b-items finished after the backup: the restored database lost them, Redis let
    # them go. They are named, and their senders' resends are accepted again.
    assert "lost with it: 8 items" in out and ", ".join(after) in out
    await cli(servers, "maintenance", "off")
    assert not await queue.enqueue(runtime.durable, "c0", {"text": "again"})  # still known
    assert await enqueue(runtime, "b", 8) == after  # accepted again after the reset

    async with workers(runtime):
        await wait_until(lambda: _at_least(runtime, 24), timeout=60, message="all items done")
    rows = await runtime.pg.fetch(
        "SELECT item_id, stage, count(*) AS n, min(completed_at) AS at FROM pipeline_journal"
        " GROUP BY 1, 2 ORDER BY 1, 2")
    assert {(r["item_id"], r["stage"]) for r in rows} == {
        (i, s) for i in before + after + waiting for s in STAGES}
    assert {r["n"] for r in rows} == {1}
    ran_before = {(r["item_id"], r["stage"]): r["completed_at"] for r in journal_before}
    for row in rows:  # nothing the restored database had finished ran again
        if row["item_id"] in before:
            assert row["at"] == ran_before[row["item_id"], row["stage"]]
    assert await runtime.pg.fetchval(
        "SELECT count(*) FROM conversation_messages WHERE text = 'kept?'") == 1
    offsets = [r["offset"] for r in await runtime.pg.fetch(
        "SELECT \"offset\" FROM feed WHERE topic = 'pipeline' ORDER BY 1")]
    assert offsets == list(range(1, 24 * len(STAGES) + 1))  # the backup's, then on from there
    assert await runtime.pg.fetchval(
        "SELECT count(DISTINCT (payload->>'item_id', kind)) FROM feed WHERE topic = 'pipeline'"
    ) == 24 * len(STAGES)


async def test_reset_is_refused_outside_maintenance(runtime: Runtime,
                                                    servers: ServerSet) -> None:
    code, _, err = await gateway_cli(servers, "recover", "--reset")
    assert code == 1 and "maintenance" in err


async def test_reset_is_refused_while_a_worker_holds_an_item(runtime: Runtime,
                                                              servers: ServerSet) -> None:
    """Maintenance stops new takes, not what a worker holds: while it holds an item the
    reset is refused and changes nothing; once the worker is done it runs."""
    assert await queue.enqueue(runtime.durable, "held", {"text": "document held"})
    lease = await queue.fetch(runtime.durable, "store", "a-worker", 60_000)
    assert lease is not None
    await cli(servers, "maintenance", "on", "--reason", "restore from backup")
    code, _, err = await gateway_cli(servers, "recover", "--reset")
    assert code == 1 and "1 item(s) still held by workers" in err
    assert await runtime.durable.hexists(inflight_key("store"), "held")  # nothing rebuilt
    await queue.complete(runtime.durable, lease)  # the worker finishes what it held
    assert "reset: 1 items back" in await cli(servers, "recover", "--reset")


async def _at_least(runtime: Runtime, count: int) -> Any:
    return await graphs(runtime) >= count
