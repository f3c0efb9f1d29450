"""AutoPipeline on a real Redis: coalescing, per-caller results, error isolation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from gateway import keys
from gateway.stores import embedded
from gateway.stores import redis as redis_clients
from gateway.stores.coalesce import AutoPipeline, NotOnDisk, _buffered_replies
from gateway.stores.embedded import free_port
from gateway.stores.runtime import Runtime
from tests.helpers import wait_until

COUNTER = keys.brute("{autopipeline-test}", "counter")


async def test_concurrent_callers_share_round_trips(runtime: Runtime) -> None:
    auto = AutoPipeline(runtime.durable)
    replies = await asyncio.gather(*(auto.execute("INCR", COUNTER) for _ in range(200)))
    assert sorted(replies) == list(range(1, 201))
    assert auto.flushes <= 4, f"{auto.flushes} round trips for 200 concurrent commands"


async def test_a_flush_spanning_many_slots_answers_each_caller(runtime: Runtime) -> None:
    """On a cluster the keys below land on every primary; each caller still gets its own
    replies, in its own order."""
    auto = AutoPipeline(runtime.durable)
    keys_ = [keys.brute(f"spread-{n}", "counter") for n in range(100)]
    results = await asyncio.gather(*(auto.batch([("SET", key, n), ("GET", key), ("INCR", key)])
                                     for n, key in enumerate(keys_)))
    assert results == [["OK", str(n), n + 1] for n in range(100)]
    assert auto.flushes <= 4


async def test_a_batch_keeps_its_commands_together_and_in_order(runtime: Runtime) -> None:
    auto = AutoPipeline(runtime.durable)
    results = await asyncio.gather(*(auto.batch([("SET", f"{COUNTER}:{n}", n),
                                                 ("GET", f"{COUNTER}:{n}")])
                                     for n in range(50)))
    assert results == [["OK", str(n)] for n in range(50)]


async def test_one_callers_error_does_not_touch_the_others(runtime: Runtime) -> None:
    auto = AutoPipeline(runtime.durable)
    await runtime.durable.set(f"{COUNTER}:text", "not a number")
    outcomes = await asyncio.gather(
        auto.execute("INCR", COUNTER),
        auto.execute("INCR", f"{COUNTER}:text"),
        auto.execute("INCR", COUNTER),
        return_exceptions=True)
    assert outcomes[0] == 1 and outcomes[2] == 2
    assert isinstance(outcomes[1], ResponseError)


async def test_replies_read_from_the_buffer_are_read_responses_own(runtime: Runtime) -> None:
    """The replies a flush finds already read (hiredis' buffer) come back as
    ``read_response`` gives them: values decoded, each error its own redis-py class."""
    auto = AutoPipeline(runtime.durable)
    if auto.cluster:
        pytest.skip("a cluster's flush is a cluster pipeline")
    conn = await runtime.durable.connection_pool.get_connection()  # type: ignore[union-attr]
    try:
        assert _buffered_replies(conn) is not None, "hiredis is installed: the fast path runs"
    finally:
        await runtime.durable.connection_pool.release(conn)  # type: ignore[union-attr]
    await runtime.durable.set(f"{COUNTER}:text", "é")
    replies = await asyncio.gather(*(auto.batch([
        ("GET", f"{COUNTER}:text"), ("INCR", f"{COUNTER}:text"), ("EVALSHA", "0" * 40, 0),
        ("SET", f"{COUNTER}:{n}", n, "NX")]) for n in range(100)))
    for text, incr, noscript, written in replies:
        assert text == "é"
        assert type(incr) is ResponseError and "not an integer" in str(incr)
        assert isinstance(noscript, NoScriptError)
        assert written == "OK"
    assert auto.flushes <= 4


async def test_an_argument_redis_cannot_take_fails_only_its_caller(runtime: Runtime) -> None:
    auto = AutoPipeline(runtime.durable)
    outcomes = await asyncio.gather(
        auto.execute("INCR", COUNTER),
        auto.execute("SET", f"{COUNTER}:bad", {"a": 1}),
        auto.execute("INCR", COUNTER),
        return_exceptions=True)
    assert outcomes[0] == 1 and outcomes[2] == 2
    assert isinstance(outcomes[1], TypeError)
    assert not await runtime.durable.exists(f"{COUNTER}:bad")


async def _blocked(auto: AutoPipeline, name: str) -> asyncio.Future[Any]:
    """A ``BLPOP`` on the wire that holds every later flush of its connection behind it
    until ``_unblock``: a flush Redis has not answered yet, for as long as a test needs."""
    on_wire = asyncio.ensure_future(auto.execute("BLPOP", f"{COUNTER}:{name}", 30))
    await wait_until(lambda: auto.flushes == 1)
    return on_wire


async def _unblock(runtime: Runtime, name: str) -> None:
    await runtime.durable.rpush(f"{COUNTER}:{name}", "go")


@pytest.mark.single_instance
async def test_callers_arriving_during_a_flush_go_out_before_its_replies(
        runtime: Runtime) -> None:
    """While Redis has not answered flush N, the callers that arrived meanwhile are written as
    N+1 on the same connection (at most ``max_in_flight`` flushes ahead), and each flight is
    answered in send order."""
    auto = AutoPipeline(runtime.durable, max_in_flight=3)
    blocked = await _blocked(auto, "overlap")
    def incr() -> asyncio.Future[list[Any]]:
        return asyncio.ensure_future(auto.batch([("INCR", COUNTER), ("GET", COUNTER)]))

    later = [incr()]  # each caller comes once the last one is written: a flush of its own
    await wait_until(lambda: auto.flushes == 2)
    later.append(incr())
    await wait_until(lambda: auto.flushes == 3)
    later.append(incr())
    await wait_until(lambda: len(auto._pending) == 1)
    assert auto.flushes == 3, "three flushes in flight; the fourth waits for room"
    assert not blocked.done() and not any(f.done() for f in later)
    await _unblock(runtime, "overlap")
    assert await blocked == [f"{COUNTER}:overlap", "go"]
    assert [await f for f in later] == [[1, "1"], [2, "2"], [3, "3"]]
    assert auto.flushes == 4


@pytest.mark.single_instance
async def test_every_eager_at_callers_of_a_turn_are_written_at_once(runtime: Runtime) -> None:
    """With the connection in use, the caller that completes a group of ``eager_at`` writes
    the group itself, within its loop turn (Redis works on it while the turn goes on); the
    rest go out with the flusher; every caller is answered in queue order."""
    auto = AutoPipeline(runtime.durable, eager_at=3)
    blocked = await _blocked(auto, "eager")
    futures = [auto.submit([("INCR", COUNTER)]) for _ in range(7)]
    assert auto.flushes == 3, "two groups of three written before this turn ended"
    await _unblock(runtime, "eager")
    assert await blocked == [f"{COUNTER}:eager", "go"]
    assert [await f for f in futures] == [[n] for n in range(1, 8)]
    assert auto.flushes == 4, "the seventh went out with the flusher"


@pytest.mark.single_instance
async def test_flushes_in_flight_take_at_most_max_batch_bytes_together(
        runtime: Runtime) -> None:
    """Redis holds what it has not run in its query buffer, counted in used_memory: the
    flushes ahead of their replies are bounded in bytes like one flush."""
    auto = AutoPipeline(runtime.durable, max_batch_bytes=200)
    blocked = await _blocked(auto, "bytes")
    small = asyncio.ensure_future(auto.execute("SET", f"{COUNTER}:small", "x" * 50))
    await wait_until(lambda: auto.flushes == 2)
    large = asyncio.ensure_future(auto.execute("SET", f"{COUNTER}:large", "x" * 150))
    await wait_until(lambda: len(auto._pending) == 1)
    assert auto.flushes == 2, "the large one waits: it would take the flights past 200 bytes"
    await _unblock(runtime, "bytes")
    assert [await blocked, await small, await large] == [[f"{COUNTER}:bytes", "go"], "OK", "OK"]
    assert auto.flushes == 3


async def _client_id(runtime: Runtime, command: str) -> int:
    clients = await runtime.durable.client_list()
    return next(int(c["id"]) for c in clients if c["cmd"] == command)


@pytest.mark.single_instance
async def test_a_lost_connection_fails_every_flush_in_flight(runtime: Runtime) -> None:
    """The connection dies with two flushes written and unanswered: the callers of both get
    a connection error (answered 503), and the next caller goes out on another connection."""
    auto = AutoPipeline(runtime.durable)
    blocked = await _blocked(auto, "lost")
    second = asyncio.ensure_future(auto.execute("INCR", COUNTER))
    await wait_until(lambda: auto.flushes == 2)
    await runtime.durable.client_kill_filter(_id=str(await _client_id(runtime, "blpop")))
    done, _ = await asyncio.wait([blocked, second], timeout=5)
    assert done == {blocked, second}
    for caller in (blocked, second):
        assert isinstance(caller.exception(), RedisConnectionError)
    assert await auto.execute("INCR", COUNTER) == 1  # the second INCR never ran


@pytest.mark.single_instance
async def test_a_cancelled_flusher_answers_every_caller(runtime: Runtime) -> None:
    """Shutdown cancels the flusher with flushes on the wire and a caller queued behind them
    (no room): every one of them gets a connection error at once, instead of waiting forever."""
    auto = AutoPipeline(runtime.durable, max_in_flight=2)
    on_wire = await _blocked(auto, "cancel")
    in_flight = asyncio.ensure_future(auto.execute("INCR", COUNTER))
    await wait_until(lambda: auto.flushes == 2)
    queued = asyncio.ensure_future(auto.execute("INCR", COUNTER))
    await wait_until(lambda: len(auto._pending) == 1)
    flusher = auto._flusher
    assert flusher is not None
    flusher.cancel()
    done, _ = await asyncio.wait([on_wire, in_flight, queued], timeout=5)
    assert {on_wire, in_flight, queued} == done
    for caller in (on_wire, in_flight, queued):
        assert isinstance(caller.exception(), RedisConnectionError)
    assert await auto.execute("INCR", COUNTER) == 1  # a new flusher serves later callers


@pytest.mark.single_instance
async def test_drain_waits_for_the_flushes_in_flight(runtime: Runtime) -> None:
    auto = AutoPipeline(runtime.durable)
    blocked = await _blocked(auto, "drain")
    auto.send_nowait([("SET", f"{COUNTER}:drained", "1")])
    await wait_until(lambda: auto.flushes == 2)
    drained = asyncio.ensure_future(auto.drain())
    done, _ = await asyncio.wait([drained], timeout=0.1)
    assert not done, "drain returned with a flush unanswered"
    await _unblock(runtime, "drain")
    await asyncio.wait_for(drained, 5)
    assert blocked.done()
    assert await runtime.durable.get(f"{COUNTER}:drained") == "1"


async def test_each_flush_in_flight_waits_for_its_own_waitaof(
        redis_factory: Callable[..., embedded.RedisServer]) -> None:
    """``wait_aof`` with flushes in flight: each is followed by its WAITAOF, and its callers
    are answered after that WAITAOF's reply, in send order."""
    server = redis_factory("durable", binary=embedded.find_valkey_server())
    redis = redis_clients.connect(server.url, variable="test")
    try:
        auto = AutoPipeline(redis, wait_aof=True)
        blocked = asyncio.ensure_future(auto.execute("BLPOP", f"{COUNTER}:aof", 30))
        await wait_until(lambda: auto.flushes == 1)
        second = asyncio.ensure_future(auto.execute("INCR", COUNTER))
        await wait_until(lambda: auto.flushes == 2)
        await redis.rpush(f"{COUNTER}:aof", "go")
        assert [await blocked, await second] == [[f"{COUNTER}:aof", "go"], 1]
        stats = await redis.info("commandstats")
        assert stats["cmdstat_waitaof"]["calls"] == 2
    finally:
        await redis.aclose()


async def test_a_flush_not_on_disk_fails_its_callers_only(
        redis_factory: Callable[..., embedded.RedisServer]) -> None:
    """WAITAOF that cannot confirm (AOF off) fails the callers of its own flush; the
    connection is still in step (every reply was read), so later flushes go on with it."""
    server = redis_factory("durable", binary=embedded.find_valkey_server(), appendonly="no")
    redis = redis_clients.connect(server.url, variable="test")
    try:
        auto = AutoPipeline(redis, wait_aof=True)
        outcomes = await asyncio.gather(*(auto.execute("INCR", COUNTER) for _ in range(3)),
                                        return_exceptions=True)
        assert all(isinstance(o, NotOnDisk) for o in outcomes)
        assert await redis.get(COUNTER) == "3"  # written, just not confirmed on disk
    finally:
        await redis.aclose()


async def test_unawaited_writes_go_out_with_the_next_flush(runtime: Runtime) -> None:
    auto = AutoPipeline(runtime.durable)
    auto.send_nowait([("SET", f"{COUNTER}:later", "done")])
    await auto.drain()
    assert await runtime.durable.get(f"{COUNTER}:later") == "done"


async def test_a_lost_connection_fails_every_caller_and_later_calls_retry() -> None:
    dead = redis_clients.connect(f"redis://127.0.0.1:{free_port()}/0", variable="test")
    auto = AutoPipeline(dead)
    try:
        outcomes = await asyncio.gather(*(auto.execute("PING") for _ in range(5)),
                                        return_exceptions=True)
        assert all(isinstance(o, RedisConnectionError) for o in outcomes)
        with pytest.raises(RedisConnectionError):
            await auto.execute("PING")  # the flusher is not stuck after a failure
    finally:
        await dead.aclose()
