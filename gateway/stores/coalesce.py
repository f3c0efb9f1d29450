"""Automatic pipelining: the Redis commands of concurrent requests go out in one round trip.

redis-py spends ~70 µs of client CPU per command sent alone (measured on a 2-core VM), which
caps a handler that sends one command per request at about a quarter of a bare aiohttp
handler's rate. ``AutoPipeline`` collects every batch submitted during one turn of the event
loop, writes them to one pooled connection in one packed write (up to ``MAX_IN_FLIGHT``
flushes ahead of their replies), and hands each caller its own slice of the replies. It is
the idea of ioredis' ``enableAutoPipelining``; redis-py has none, hence this module.

Once the connection is in use, a turn's callers do not all wait for the turn's end: every
``EAGER_AT`` of them are written at once, by the caller that completes the group, so Redis
works on them while this process goes on with the turn's other requests. Without it the
ingest path ran as a convoy: every request of a turn parsed, then one flush, then this
process idle while Redis worked through it (~45-65 µs of idle per request).

It talks to the connection directly (its stream writer and ``read_response``, commands
packed by ``hiredis.pack_command``) rather than through ``Pipeline``: one timeout for the
whole flush instead of an ``asyncio.timeout`` per reply, and no response callbacks, so replies
are raw RESP2 values (``SET`` answers ``"OK"`` or ``None``). Errors are per command
(returned as exception values); a failure of the round trip itself (connection lost,
timeout) is raised to every caller of that flush, and the connection is dropped. A caller's
commands stay contiguous and in order on the wire, so "claim, then enqueue" keeps its order.

On Redis Cluster the commands of a flush may live in any slots: the flush goes out as one
cluster pipeline, which redis-py splits by node (one write per node, concurrently); the order
of a caller's commands is kept only among those on the same node.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from hiredis import pack_command
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from gateway import keys
from gateway.stores.redis import REDIS_TIMEOUT_SECONDS, AnyRedis

log = logging.getLogger("gateway.coalesce")
# A flush stops taking callers past this many bytes (the first caller always goes): the
# server holds a flush in its query buffer, which counts in used_memory, so eight hundred
# concurrent 1 MB jobs sent as one write would take the instance to maxmemory for a moment
# and every write of that moment would be refused.
MAX_BATCH_BYTES = 2 * 2**20
# Flushes written to the connection ahead of their replies: while Redis runs flush N, the
# callers that arrived meanwhile go out as N+1, so Redis goes on to them without waiting for
# this process to read N's replies, answer them, and write again.
# With EAGER_AT, a turn of 64 requests makes ~8 flushes: room for them (bytes still bound
# the flights together).
MAX_IN_FLIGHT = 16
# Callers written at once, within their loop turn, once the connection is in use (0: none;
# off with ``wait_aof``, where every flush waits for its own fsync). 8: ~0.5 ms of Redis work
# on the ingest path, a few more writes and reads (~1 µs of CPU per request) for the overlap.
EAGER_AT = 8
Command = Sequence[Any]
# A caller's count of commands, the commands (None when the caller packed them itself, see
# ``run_packed``), them packed as RESP, and the future of its replies (None: not awaited).
Pending = tuple[int, Sequence[Command] | None, bytes, "asyncio.Future[list[Any]] | None"]


class AutoPipeline:
    def __init__(self, redis: AnyRedis, *, max_batch: int = 1024,
                 max_batch_bytes: int = MAX_BATCH_BYTES,
                 flush_timeout: float = REDIS_TIMEOUT_SECONDS + 2.0,
                 wait_aof: bool = False, max_in_flight: int = MAX_IN_FLIGHT,
                 eager_at: int = EAGER_AT) -> None:
        """``wait_aof``: every flush ends with ``WAITAOF 1 0``, and its callers are answered
        only once the server confirms the flush's writes on its disk (one wait per batch);
        when it cannot, every caller of the batch gets ``NotOnDisk``. ``flush_timeout``: a
        round trip's budget, a call's plus WAITAOF's own 2 s. ``eager_at``: see the module."""
        self.redis = redis
        self.wait_aof = wait_aof
        # Decided once: isinstance against redis-py's cluster class (a Protocol subclass) costs
        # a few µs, on every request of the ingest path. Callers read it too.
        self.cluster = isinstance(redis, RedisCluster)
        self.max_batch = max_batch
        self.max_batch_bytes = max_batch_bytes
        self.max_in_flight = max_in_flight
        self.flush_timeout = flush_timeout
        self._pending: list[Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._idle: asyncio.Future[None] | None = None  # the flusher's wait for work
        # The flusher's connection once a flush went out on it: eager writes go there too.
        self._wire: _Wire | None = None
        self.eager_at = 0 if wait_aof else eager_at
        self._barrier_keys: dict[str, str] = {}  # cluster node name -> its sync: key
        self._loading: dict[str, asyncio.Future[Any]] = {}  # script SHA -> its SCRIPT LOAD
        self.flushes = 0  # round trips sent, for benchmarks and tests

    async def batch(self, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` with the next flush; their raw replies, errors as values.

        An argument Redis cannot take (not str, bytes, int or float) raises ``TypeError`` here,
        for this caller alone, before anything is queued."""
        return await self.submit(commands)

    def submit(self, commands: Sequence[Command]) -> asyncio.Future[list[Any]]:
        """``batch`` without waiting: queued now (in order with everything queued before),
        the future of its replies, for a caller that only wants to know how it went
        (``add_done_callback``) or waits later. Raises ``TypeError`` as ``batch`` does."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._enqueue(commands, future)
        return future

    async def execute(self, *args: Any) -> Any:
        """One command through the shared pipeline; raises its error."""
        (reply,) = await self.batch([args])
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def run_script(self, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """A registered script (redis-py ``Script``) by SHA through the shared pipeline.

        When the server forgot it (new server, restart, failover) the script is loaded and
        called by SHA again *through the pipeline*: a direct call would go out on another
        connection, outside the flush's ``WAITAOF`` (which covers only its own connection's
        writes), so a 202 could be answered for a write not yet on disk."""
        call = ("EVALSHA", script.sha, len(keys), *keys, *args)
        if self.cluster:  # the cluster pipeline needs the command, not its packed bytes
            (reply,) = await self.batch([call])
            return await self._script_error(script, self.batch, [call], reply)
        return await self.run_packed(script, pack_command(call))

    async def run_packed(self, script: Any, packed: bytes) -> Any:
        """``run_script`` for one ``EVALSHA`` of ``script`` the caller packed as RESP itself
        (``gateway.pipeline.queue.PackedAdds``: most of a call is the same every time).
        Not on a cluster, whose pipeline routes commands, not bytes."""
        if self.cluster:
            raise TypeError("a cluster's flush takes commands, not packed bytes")
        (reply,) = await self._packed_future(packed)
        if isinstance(reply, Exception):
            return await self._script_error(script, self._packed_future, packed, reply)
        return reply

    def _packed_future(self, packed: bytes) -> asyncio.Future[list[Any]]:
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._pending.append((1, None, packed, future))
        self._start_flusher()
        return future

    async def _script_error(self, script: Any, send: Callable[[Any], Awaitable[list[Any]]],
                            call: Any, reply: Exception) -> Any:
        """A script call answered an error: after ``NOSCRIPT`` the script is loaded and
        called again (its answer returned), any other error (or the second's) raised."""
        if isinstance(reply, NoScriptError):
            await self._load(script)
            (reply,) = await send(call)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _load(self, script: Any) -> None:
        """``SCRIPT LOAD`` (on a cluster: every primary), one for every caller that met the
        same ``NOSCRIPT`` meanwhile: after a restart each concurrent caller used to send its
        own, each on a connection of its own."""
        loading = self._loading.get(script.sha)
        if loading is None:
            loading = asyncio.ensure_future(self.redis.script_load(script.script))
            self._loading[script.sha] = loading
            loading.add_done_callback(lambda done: self._loaded(script.sha, done))
        await asyncio.shield(loading)  # a caller that gives up leaves the load to the others

    def _loaded(self, sha: str, done: asyncio.Future[Any]) -> None:
        self._loading.pop(sha, None)
        if not done.cancelled():
            done.exception()  # retrieved: every waiter may have given up

    def send_nowait(self, commands: Sequence[Command]) -> None:
        """Send with the next flush without waiting for the replies (errors are logged): for
        writes whose loss is harmless, e.g. turning a claim into ``done``."""
        self._enqueue(commands, None)

    async def drain(self) -> None:
        """Wait until everything submitted so far is sent (call before closing the client)."""
        while self._flusher is not None:
            await asyncio.shield(self._flusher)

    def _enqueue(self, commands: Sequence[Command],
                 future: asyncio.Future[list[Any]] | None) -> None:
        # Packed in the caller's turn (hiredis, in C): a bad argument fails its own caller,
        # never the batch it would have joined.
        packed = b"".join([pack_command(tuple(command)) for command in commands])
        self._pending.append((len(commands), commands, packed, future))
        self._start_flusher()

    def _start_flusher(self) -> None:
        if self._flusher is None:
            # A task starts on the next loop turn: callers ready in this turn join the batch.
            self._flusher = asyncio.create_task(self._flush_loop())
        else:
            if self.eager_at and len(self._pending) >= self.eager_at:
                self._write_now()
            if self._pending and self._idle is not None and not self._idle.done():
                self._idle.set_result(None)  # likewise: the flusher takes them on the next turn

    def _write_now(self) -> None:
        """The callers pending, written in this turn (see the module) when the flusher's
        connection is open, not behind its health check, and has room."""
        wire = self._wire
        if wire is None or wire.writing or wire.error is not None or not wire.open():
            return
        room = wire.room(self)
        taken = self._take(room, False) if room else []
        if taken:
            self._put(wire, taken)

    def _wake(self) -> None:
        """The reader answered or dropped a flush: the flusher may send the next one."""
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    async def _flush_loop(self) -> None:
        """Writes flushes to one pooled connection while callers are pending, up to
        ``max_in_flight`` of them (and ``max_batch_bytes`` together) ahead of their replies,
        which a reader task (``_read``) hands out in send order; it ends, releasing the
        connection, once nothing is pending or unanswered."""
        taken: list[Pending] = []
        # Flushes that follow each other go out on one pooled connection: redis-py's pool
        # costs ~25 µs of CPU per get and release (a lock, its metrics, a readiness check).
        wire: _Wire | None = None
        try:
            while True:
                if wire is not None and wire.error is not None:  # dropped: the next takes another
                    dropped, wire = wire, None
                    self._wire = None
                    await self._release(dropped)
                room = self.max_batch_bytes if wire is None else wire.room(self)
                taken = self._take(room, wire is None or not wire.flights) if room else []
                if taken:
                    if self.cluster:
                        await self._cluster_flush(taken)
                    else:
                        if wire is None:
                            wire = _Wire(await self.redis.connection_pool.get_connection())  # type: ignore[union-attr]
                        await self._write(wire, taken)
                    taken = []
                    continue
                if not self._pending and (wire is None or not wire.flights):
                    break
                # Waiting for callers (room on the wire) or for a flight's replies (none).
                self._idle = asyncio.get_running_loop().create_future()
                try:
                    await self._idle
                finally:
                    self._idle = None
        finally:
            # Cancelled (shutdown): the flushes on the wire and the stragglers get an answer
            # too, the one for a store that went away, so no caller waits forever.
            self._flusher = None
            self._wire = None
            stopped = RedisConnectionError("the command coalescer stopped before the reply")
            if wire is not None:
                if wire.flights or taken:  # replies left unread: the socket is out of step
                    await wire.drop(stopped)
                await self._release(wire)
            unanswered, self._pending = [*taken, *self._pending], []
            if unanswered:
                _fail(unanswered, stopped)

    async def _release(self, wire: _Wire) -> None:
        """The connection back to the pool once its reader is gone (a dropped connection is
        disconnected: the pool connects it again when it is next taken)."""
        if wire.reader is not None:  # dropped: the reader, cancelled or failing, ends soon
            await asyncio.wait([wire.reader])
        await self.redis.connection_pool.release(wire.conn)  # type: ignore[union-attr]

    def _take(self, room: int, first_goes: bool = True) -> list[Pending]:
        """The callers of the next flush, up to ``max_batch`` commands and ``room`` bytes;
        the first caller goes alone past ``room`` when ``first_goes`` (nothing in flight)."""
        # A caller that gave up before its commands went out (its request's budget ran out:
        # it was answered 503) is dropped: what it was told stays true.
        self._pending = [p for p in self._pending if p[3] is None or not p[3].cancelled()]
        count = size = 0
        for index, (calls, _, packed, _) in enumerate(self._pending):
            count += calls
            size += len(packed)
            if size > room and (index or not first_goes):
                taken = self._pending[:index]
            elif count >= self.max_batch or size >= room:
                taken = self._pending[: index + 1]
            else:
                continue
            del self._pending[: len(taken)]
            return taken
        taken, self._pending = self._pending, []
        return taken

    async def _write(self, wire: _Wire, taken: list[Pending]) -> None:
        """One flush written to ``wire`` by the flusher, its replies left to the reader; a
        failed write drops the connection and fails every caller on it."""
        try:
            async with asyncio.timeout(self.flush_timeout):
                if not wire.flights:
                    # A connect or a health check (a PING and its reply) only with no reply
                    # unread, and no eager write behind either: redis-py's own write would
                    # make a task of every write (asyncio.wait_for), the bytes a turn later.
                    wire.writing = True
                    try:
                        if not wire.open():
                            await wire.conn.connect()
                        await wire.conn.check_health()
                    finally:
                        wire.writing = False
                elif not wire.open():
                    raise RedisConnectionError("the connection closed with replies unread")
                if wire.error is not None:  # the reader failed meanwhile: out of step
                    _fail(taken, wire.error)
                    return
                self._put(wire, taken)
                taken = []
                self._wire = wire
                await wire.conn._writer.drain()  # the transport's buffer past its high mark
        except Exception as exc:
            if isinstance(exc, OSError):  # as redis-py's own write raises it
                exc = RedisConnectionError(f"Error while writing to socket: {exc}")
            await wire.drop(exc)
            _fail(taken, exc)

    def _put(self, wire: _Wire, taken: list[Pending]) -> None:
        """``taken`` handed to the connection's transport (to the socket now, or its buffer)
        and recorded as a flight: nothing awaited, so a flush's bytes and its flight keep
        their order against every other write on the connection."""
        self.flushes += 1
        packed = b"".join([packed for _, _, packed, _ in taken]
                          + ([_WAITAOF] if self.wait_aof else []))
        wire.conn._writer.write(packed)
        deadline = asyncio.get_running_loop().time() + self.flush_timeout
        wire.flights.append(_Flight(taken, sum(count for count, _, _, _ in taken),
                                    len(packed), deadline))
        wire.bytes += len(packed)
        if wire.reader is None:
            wire.reader = asyncio.create_task(self._read(wire))

    async def _read(self, wire: _Wire) -> None:
        """Reads the replies of ``wire``'s flights in send order (Redis answers a connection's
        commands in order), each within its deadline, and answers their callers. A failure
        (connection lost, timeout, cancelled) drops the connection and fails every flight."""
        conn = wire.conn
        try:
            while wire.flights:
                flight = wire.flights[0]
                replies: list[Any] = []
                async with asyncio.timeout_at(flight.deadline):
                    buffered = _buffered_replies(conn)
                    for _ in range(flight.replies):
                        reply = buffered() if buffered is not None else _INCOMPLETE
                        if reply is _INCOMPLETE:  # not read from the socket yet: redis-py waits
                            try:
                                reply = await conn.read_response(timeout=math.inf)
                            except ResponseError as exc:
                                reply = exc
                        elif isinstance(reply, RedisConnectionError):  # as read_response raises
                            raise reply
                        replies.append(reply)
                    on_disk = await _reply_or_error(conn) if self.wait_aof else None
                wire.flights.popleft()
                wire.bytes -= flight.size
                try:
                    if self.wait_aof:
                        _check_on_disk([on_disk])
                except NotOnDisk as exc:  # this flight only: the socket is still in step
                    _fail(flight.taken, exc)
                else:
                    _answer(flight.taken, replies)
                self._wake()
        except BaseException as exc:
            await wire.drop(exc if isinstance(exc, Exception) else RedisConnectionError(
                "the command coalescer stopped before the reply"))
            self._wake()
            if not isinstance(exc, Exception):
                raise
        finally:
            if wire.reader is asyncio.current_task():
                wire.reader = None

    async def _cluster_flush(self, taken: list[Pending]) -> None:
        """One flush on a cluster, one at a time: its replies come from several nodes."""
        try:
            replies = await self._cluster_send([c for _, commands, _, _ in taken
                                                for c in commands or ()])
        except Exception as exc:
            _fail(taken, exc)
        else:
            _answer(taken, replies)

    async def _cluster_send(self, commands: list[Command]) -> list[Any]:
        """The flush as one cluster pipeline: redis-py groups it by node and sends each
        node's share as one write, concurrently."""
        self.flushes += 1
        async with asyncio.timeout(self.flush_timeout), \
                self.redis.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            replies = await pipe.execute(raise_on_error=False)
            if self.wait_aof:  # every primary: the flush may have written to any of them
                primaries = self.redis.get_primaries()  # type: ignore[union-attr]
                _check_on_disk(list(await asyncio.gather(
                    *(self._barrier(node) for node in primaries))))
        # A cluster pipeline applies redis-py's response callbacks; undo the two that change
        # a simple-string reply into True, so callers see RESP2 replies on every topology.
        return [_UNCALLBACK.get(str(command[0]).upper(), {}).get(reply, reply)
                if reply is True else reply
                for command, reply in zip(commands, replies, strict=True)]

    async def _barrier(self, node: Any) -> Any:
        """``WAITAOF`` covers the writes of its own connection only, and a cluster pipeline
        spreads a flush over a node's pooled connections; so one connection writes a barrier
        key in this node's slots, then waits: the barrier's offset is past every earlier
        write on the node, so its fsync is theirs. The WAITAOF answer (or its error)."""
        key = self._barrier_keys.get(node.name) or self._find_barrier_key(node.name)
        conn = node.acquire_connection()
        try:
            await conn.send_packed_command(
                pack_command(("SET", key, "1", "PX", _BARRIER_MS))  # type: ignore[arg-type]
                + _WAITAOF)
            written = await _reply_or_error(conn)
            waited = await _reply_or_error(conn)
        except BaseException:
            await conn.disconnect(nowait=True)
            raise
        finally:
            node.release(conn)
        if isinstance(written, Exception):  # MOVED after a resharding: look again next time
            self._barrier_keys.pop(node.name, None)
            return written
        return waited

    def _find_barrier_key(self, name: str) -> str:
        """A ``sync:`` key whose slot the node ``name`` serves (a few hundred tries at most
        for a node that holds 1/N of the slots)."""
        for tag in range(_BARRIER_TRIES):
            key = keys.sync_barrier(tag)
            if self.redis.get_node_from_key(key).name == name:  # type: ignore[union-attr]
                self._barrier_keys[name] = key
                return key
        raise NotOnDisk(f"no slot of {name} found for the durability barrier")


_BARRIER_MS, _BARRIER_TRIES = "10000", 100_000
_UNCALLBACK: dict[str, dict[Any, Any]] = {"SET": {True: "OK"}, "PING": {True: "PONG"}}
# WAITAOF numlocal numreplicas timeout: this server's own AOF fsync, no replica, at most 2 s
# (appendfsync everysec syncs once a second).
_WAITAOF = pack_command(("WAITAOF", "1", "0", "2000"))  # type: ignore[arg-type]


class NotOnDisk(RedisConnectionError):
    """The server did not confirm a batch on its disk (no WAITAOF, AOF off, or too slow): its
    writes may have happened, so the sender's retry is answered as a duplicate."""


try:  # the sentinel redis-py's hiredis parser gives its Reader for an incomplete reply
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _INCOMPLETE
except ImportError:  # another redis-py: every reply through read_response
    _INCOMPLETE = None


def _buffered_replies(conn: Any) -> Callable[[], Any] | None:
    """``gets`` of the connection's hiredis Reader (RESP2): it hands out the replies already
    read from the socket (a flush's replies mostly arrive together) as ``read_response``
    would, errors as values, without its three coroutines and checks per reply (~3 µs: one
    reply per request on the ingest path). None when redis-py parses otherwise."""
    reader = getattr(getattr(conn, "_parser", None), "_reader", None)
    if _INCOMPLETE is None or reader is None or str(getattr(conn, "protocol", 2)) != "2":
        return None
    gets: Callable[[], Any] = reader.gets
    return gets


async def _reply_or_error(conn: Any) -> Any:
    try:
        return await conn.read_response(timeout=math.inf)
    except ResponseError as exc:
        return exc


def _check_on_disk(answers: list[Any]) -> None:
    for answer in answers:
        if isinstance(answer, Exception):
            raise NotOnDisk(f"WAITAOF failed: {answer}")
        if not isinstance(answer, list) or not answer or int(answer[0]) < 1:
            raise NotOnDisk("the write is not confirmed on disk within 2 s")


def _fail(taken: list[Pending], exc: BaseException) -> None:
    """Every awaiting caller of ``taken`` gets ``exc``; lost unawaited writes are counted."""
    lost = sum(1 for _, _, _, future in taken if future is None)
    if lost:
        log.warning("%d unawaited redis writes lost: %s", lost, type(exc).__name__)
    for _, _, _, future in taken:
        if future is not None and not future.done():
            future.set_exception(exc)


def _answer(taken: list[Pending], replies: list[Any]) -> None:
    """Each caller of a flush gets its slice of the replies (an unawaited one's errors are
    logged)."""
    start = 0
    for count, _, _, future in taken:
        end = start + count
        if future is None:
            _log_errors(replies[start:end])
        elif not future.done():
            future.set_result(replies[start:end])
        start = end


class _Flight(NamedTuple):
    """A flush written to the connection whose replies are not read yet."""

    taken: list[Pending]
    replies: int  # replies expected, WAITAOF's not counted
    size: int  # bytes written
    deadline: float  # loop time by which its replies (and WAITAOF's) are read


class _Wire:
    """A pooled connection and its flights, oldest first (Redis answers in that order)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.flights: deque[_Flight] = deque()
        self.bytes = 0  # written and not answered: bounded like one flush
        self.reader: asyncio.Task[None] | None = None
        self.error: Exception | None = None  # set once the connection is dropped
        self.writing = False  # the flusher's health check is on it: nobody else writes

    def open(self) -> bool:
        writer = getattr(self.conn, "_writer", None)
        return writer is not None and not writer.transport.is_closing()

    def room(self, auto: AutoPipeline) -> int:
        """Bytes the next flush may take (0: it waits for a flight's replies)."""
        if not self.flights:
            return auto.max_batch_bytes
        if len(self.flights) >= auto.max_in_flight:
            return 0
        return max(0, auto.max_batch_bytes - self.bytes)

    async def drop(self, exc: Exception) -> None:
        """Disconnect (replies may be left unread on the socket) and fail every flight's
        callers with ``exc``; once (a reader and the flusher may both see the failure)."""
        if self.error is not None:
            return
        self.error = exc
        flights, self.flights, self.bytes = list(self.flights), deque(), 0
        for flight in flights:
            _fail(flight.taken, exc)
        reader = self.reader
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()  # its read would fail on the closed socket anyway
        await self.conn.disconnect(nowait=True)


def _log_errors(replies: list[Any]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            log.warning("unawaited redis write failed: %s", reply)
