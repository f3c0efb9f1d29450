"""``Deadlines``: asyncio.timeout's behaviour for a route's requests, with one timer."""

from __future__ import annotations

import asyncio

import pytest

from gateway.api.deadlines import Deadlines


async def _within(deadlines: Deadlines, work: asyncio.Future[object] | float) -> str:
    """Run as the guarded routes do: "done", "timeout" (the budget ran out), or the
    CancelledError of someone else goes up."""
    entry = deadlines.enter()
    try:
        if isinstance(work, float):
            await asyncio.sleep(work)
        else:
            await work
        return "done"
    except asyncio.CancelledError:
        if not deadlines.leave(entry, cancelled=True):
            raise
        return "timeout"
    finally:
        deadlines.leave(entry)


async def test_each_request_runs_out_at_its_own_deadline() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(0.2)
    started = loop.time()
    first = asyncio.create_task(_within(deadlines, 5.0))
    await asyncio.sleep(0.1)
    second = asyncio.create_task(_within(deadlines, 5.0))
    quick = asyncio.create_task(_within(deadlines, 0.01))
    assert await quick == "done"
    assert await first == "timeout"
    first_at = loop.time() - started
    assert await second == "timeout"
    second_at = loop.time() - started
    assert 0.2 <= first_at < 0.29
    assert 0.3 <= second_at < 0.39
    assert first.cancelling() == 0 and second.cancelling() == 0  # uncancelled, as timeout()


async def test_a_cancellation_from_elsewhere_is_not_a_timeout() -> None:
    deadlines = Deadlines(5.0)
    task = asyncio.create_task(_within(deadlines, 5.0))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_finished_requests_are_dropped_and_never_cancelled() -> None:
    deadlines = Deadlines(0.05)
    for _ in range(100):
        assert await _within(deadlines, 0.0) == "done"
    await asyncio.sleep(0.1)  # the timer fired past every deadline: nothing left to watch
    assert not deadlines._waiting and deadlines._timer is None
    assert await _within(deadlines, 0.0) == "done"  # and a new request arms it again
    assert deadlines._timer is not None


async def test_an_error_raised_after_the_cancellation_goes_up_as_itself() -> None:
    """A handler that turns the cancellation into its own error: that error is answered,
    not the timeout (asyncio.timeout converts only a CancelledError)."""
    deadlines = Deadlines(0.05)

    async def handler() -> None:
        entry = deadlines.enter()
        try:
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                raise LookupError("mine") from None
        finally:
            assert not deadlines.leave(entry)

    with pytest.raises(LookupError, match="mine"):
        await handler()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


def test_a_new_loop_starts_afresh() -> None:
    deadlines = Deadlines(0.05)
    for _ in range(2):  # the second loop finds the first one's state and drops it
        assert asyncio.run(_within(deadlines, 0.2)) == "timeout"
