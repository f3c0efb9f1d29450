"""AutoPipeline on a real Redis: coalescing, per-caller results, error isolation."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from gateway import keys
from gateway.stores import redis as redis_clients
from gateway.stores.coalesce import AutoPipeline, _buffered_replies
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


@pytest.mark.single_instance
async def test_a_cancelled_flusher_answers_every_caller(runtime: Runtime) -> None:
    """Shutdown cancels the flusher mid-flush: the callers whose commands are on the wire and
    those queued behind them get a connection error at once, instead of waiting forever."""
    auto = AutoPipeline(runtime.durable)
    on_wire = asyncio.ensure_future(auto.execute("BLPOP", f"{COUNTER}:never", 30))
    await wait_until(lambda: auto._flusher is not None and auto.flushes == 1)
    queued = asyncio.ensure_future(auto.execute("INCR", COUNTER))
    await wait_until(lambda: len(auto._pending) == 1)  # queued behind the flush on the wire
    flusher = auto._flusher
    assert flusher is not None
    flusher.cancel()
    done, _ = await asyncio.wait([on_wire, queued], timeout=5)
    assert {on_wire, queued} == done
    for caller in (on_wire, queued):
        assert isinstance(caller.exception(), RedisConnectionError)
    assert await auto.execute("INCR", COUNTER) == 1  # a new flusher serves later callers


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
