"""PostgreSQL's own time per answered chat message, statement by statement.

Run from the repository root: ``python bench/chat_statements.py [--messages 1000]``. An
embedded PostgreSQL with ``pg_stat_statements`` (``track = all``, so the statements inside
``conversation_receive`` and ``conversation_reply`` are counted too, ``track_planning``
on) runs what the service runs per answered message, on one connection, one message after
another over 50 chats: ``store.receive``, ``store.reply``, ``store.settle``. Printed per
message: calls, execution and planning time of each statement (top level ones first). The
nested rows are included in their caller's time. Single-threaded and without the rest of the
service, so it shows where PostgreSQL's part goes, not what a loaded server spends in all
(parse, protocol, commits and the WAL writer come on top: ``bench/conversations.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import asyncpg

from gateway.conversations import store
from gateway.conversations.model import Incoming
from gateway.stores import embedded, postgres
from gateway.stores.migrate import migrate_url

CHATS = 50
SETTINGS = {"shared_preload_libraries": "pg_stat_statements",
            "pg_stat_statements.track": "all", "pg_stat_statements.track_planning": "on"}


async def _run_each(url: str, *statements: str) -> None:
    """Each statement on its own (ALTER SYSTEM cannot run inside a transaction block)."""
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def _answer(conn: asyncpg.Connection, prefix: str, i: int) -> None:
    incoming = Incoming(platform="telegram", chat=str(i % CHATS), thread=None, user_id="7",
                        user_name="bob", text="hi there", message_id=f"{prefix}{i}")
    received = await store.receive(conn, incoming, None, is_new=False)
    answer = await store.reply(conn, incoming, received.conversation_id, received.seq,
                               "hello back")
    await store.settle(conn, received.conversation_id, answer.seq)


async def measure(url: str, messages: int) -> None:
    pool = await postgres.create_pool(url, max_size=1)
    try:
        async with pool.acquire() as conn:
            for i in range(CHATS):  # every chat's conversation exists; plans are cached
                await _answer(conn, "warm", i)
            await conn.execute("SELECT pg_stat_statements_reset()")
            for i in range(messages):
                await _answer(conn, "m", i)
            rows = await conn.fetch(
                "SELECT calls, total_exec_time, total_plan_time, toplevel, query"
                " FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'"
                " ORDER BY toplevel DESC, total_exec_time DESC")
    finally:
        await pool.close()
    for r in rows:
        if r["calls"] < messages:  # control flow of PL/pgSQL (FOUND, p_is_new)
            continue
        query = " ".join(r["query"].split())
        exec_us, plan_us = (1000 * r[f"total_{kind}_time"] / messages for kind in ("exec", "plan"))
        print(f"{r['calls'] / messages:4.1f}/msg  exec {exec_us:6.1f} µs  plan {plan_us:5.1f} µs"
              f"  {'top' if r['toplevel'] else '   '}  {query[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gwb-") as root:
        pg = embedded.PostgresServer(Path(root) / "pg").start()
        try:  # preloaded libraries are read at start only: set, then restart on the same data
            asyncio.run(_run_each(pg.url, *(f"ALTER SYSTEM SET {name} = '{value}'"
                                             for name, value in SETTINGS.items())))
            pg.stop()
            pg.start()
            asyncio.run(_run_each(pg.url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
            asyncio.run(migrate_url(pg.url))
            asyncio.run(measure(pg.url, args.messages))
        finally:
            pg.stop()


if __name__ == "__main__":
    main()
