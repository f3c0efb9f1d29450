"""The asyncpg pool; JSON and JSONB columns decode to Python objects everywhere, and
pgvector's ``vector`` to numpy arrays where the extension is installed."""

from __future__ import annotations

import json
from typing import Any, cast

import asyncpg
from pgvector import Vector


async def _init_connection(conn: asyncpg.Connection) -> None:
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(typename, encoder=json.dumps, decoder=json.loads,
                                  schema="pg_catalog")
    try:  # binary both ways; read as numpy arrays, like float8[] columns are read as lists
        await conn.set_type_codec(
            "vector", schema="public", format="binary",
            encoder=lambda v: (v if isinstance(v, Vector) else Vector(v)).to_binary(),
            decoder=lambda data: Vector.from_binary(data).to_numpy())
    except ValueError:  # no `vector` type here: chunk vectors are float8[] (a scan)
        pass


# A statement that runs longer is cancelled by the client. Waits that may rightly be longer
# (a busy chat's lock) are taken in server-bounded slices below it.
COMMAND_TIMEOUT_SECONDS = 30.0
# Opening a connection (TCP, TLS, authentication) takes at most this; asyncpg's default is
# 60 s, and a stalled server accepts the TCP connection and then says nothing.
CONNECT_SECONDS = 5.0


class GatewayConnection(asyncpg.Connection):
    """A pooled connection that can run the pool's reset (``get_reset_query``: advisory
    locks, cursors, LISTEN, session settings) with its borrower's COMMIT, in one round trip:
    ``reset_at_commit``, or skip it for a borrower that leaves no session state:
    ``leave_clean``. Nothing else differs."""

    _reset_at: int | None = None  # queries_count when the session was left reset or clean
    _commit_resets = False  # reset_at_commit was called and its COMMIT has not run yet

    def reset_at_commit(self) -> None:
        """The open top-level transaction's COMMIT resets the session first, in the same
        round trip, and the release then skips its own reset: for a borrower that runs
        nothing after its transaction. The reset goes before the COMMIT, inside the
        transaction, so an error in it rolls the transaction back (the COMMIT raises only
        when nothing was committed, as alone). A transaction that rolls back instead leaves
        the release to reset as usual."""
        self._commit_resets = True

    def leave_clean(self) -> None:
        """The borrower ran only statements that leave nothing in the session (no setting,
        lock, cursor or LISTEN outlives them) on a connection fresh from the pool: the
        release skips its reset, unless a query runs after this."""
        if not self.is_in_transaction():
            self._reset_at = _queries(self)

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        # asyncpg's Transaction commits with exactly this statement (a savepoint's release
        # is another).
        if self._commit_resets and query == "COMMIT;" and not args:
            self._commit_resets = False
            status: str = await super().execute(f"{self.get_reset_query()}\n{query}",
                                                timeout=timeout)
            self._reset_at = _queries(self)
            return status
        return cast(str, await super().execute(query, *args, timeout=timeout))

    def take_reset(self) -> bool:
        """The session was reset with a COMMIT (``reset_at_commit``) or left clean
        (``leave_clean``) and nothing ran since (for the pool's release; forgets the mark)."""
        done = self._reset_at is not None and self._reset_at == _queries(self)
        self._reset_at = None
        return done and not self.is_in_transaction()


def leave_clean(conn: asyncpg.Connection) -> None:
    """``GatewayConnection.leave_clean`` for a borrower that may hold a plain connection (a
    pool built elsewhere): there the release resets as usual."""
    if isinstance(conn, GatewayConnection):
        conn.leave_clean()


def _queries(conn: asyncpg.Connection) -> int | None:
    # The count asyncpg's pool itself reads for max_queries; None (reset as usual) if a
    # later asyncpg has no such counter.
    return getattr(getattr(conn, "_protocol", None), "queries_count", None)


async def _reset(conn: asyncpg.Connection) -> None:
    """The pool's reset on release (after asyncpg's own rollback of an open transaction):
    asyncpg's reset query, unless it ran already with the borrower's COMMIT
    (``reset_at_commit``), or the borrower left nothing to reset (``leave_clean``)."""
    if isinstance(conn, GatewayConnection):
        conn._commit_resets = False  # a rolled back transaction's mark ends with its borrow
        if conn.take_reset():
            return
    await conn.execute(conn.get_reset_query())


class BoundedPool(asyncpg.Pool):
    """An asyncpg pool whose ``acquire()`` waits at most ``acquire_seconds`` for a connection
    (opening a new one included) unless the caller gives its own timeout; then
    ``TimeoutError``, which a request answers with 503 + Retry-After. ``fetch``, ``execute``
    and the other pool shortcuts acquire through it too. asyncpg gives the release of a
    connection the same budget: a statement that timed out on a stalled server waits that
    long for its cancellation, then the connection is dropped, not kept waiting."""

    def __init__(self, *args: Any, acquire_seconds: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acquire_seconds = acquire_seconds

    def acquire(self, *, timeout: float | None = None) -> Any:
        return super().acquire(timeout=self.acquire_seconds if timeout is None else timeout)


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10,
                      command_timeout: float = COMMAND_TIMEOUT_SECONDS,
                      acquire_seconds: float = COMMAND_TIMEOUT_SECONDS,
                      connect_seconds: float = CONNECT_SECONDS,
                      server_settings: dict[str, str] | None = None) -> asyncpg.Pool:
    """A pool whose statements are cancelled after ``command_timeout``, whose callers wait
    at most ``acquire_seconds`` for a connection, and whose connections open within
    ``connect_seconds``: no call on it waits without a bound. ``server_settings``: session
    settings of its connections (they survive the reset a connection gets when returned)."""
    pool = BoundedPool(dsn, acquire_seconds=acquire_seconds, min_size=min_size,
                       max_size=max_size, max_queries=50_000,
                       max_inactive_connection_lifetime=300.0, init=_init_connection,
                       reset=_reset, loop=None, connection_class=GatewayConnection,
                       record_class=asyncpg.Record, command_timeout=command_timeout,
                       timeout=connect_seconds, server_settings=server_settings)
    await pool
    return pool
