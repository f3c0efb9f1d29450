"""The log cannot leak a secret, even in a traceback, nor be flooded by one repeated error."""

from __future__ import annotations

import io
import logging

from gateway.logging_setup import RedactingFormatter, RepeatLimiter

SECRET = "s3cr3t-token-value"


def _logger(stream: io.StringIO, limiter: RepeatLimiter | None = None) -> logging.Logger:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingFormatter("%(levelname)s %(name)s: %(message)s", [SECRET]))
    if limiter is not None:
        handler.addFilter(limiter)
    logger = logging.getLogger(f"gateway.test.{id(stream)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_a_secret_in_a_traceback_is_masked() -> None:
    stream = io.StringIO()
    logger = _logger(stream)
    try:
        raise RuntimeError(f"call to https://api.test/bot123456:{SECRET}AAAAAAAAAAAA failed")
    except RuntimeError:
        logger.exception("request failed for %s", SECRET)
    written = stream.getvalue()
    assert "Traceback" in written and "RuntimeError" in written
    assert SECRET not in written and "***" in written


def test_one_repeated_error_is_written_a_bounded_number_of_times() -> None:
    stream = io.StringIO()
    limiter = RepeatLimiter(repeats=5, window=60)
    logger = _logger(stream, limiter)
    for n in range(1000):
        logger.error("bad input from %s", f"client-{n}")
    logger.warning("something else")
    lines = stream.getvalue().splitlines()
    assert len([line for line in lines if "bad input" in line]) == 5
    assert lines[-1].endswith("something else")
    limiter.window = 0  # as if the window passed: the next one says how many were dropped
    logger.error("bad input from %s", "later")
    assert "995 more like it" in stream.getvalue().splitlines()[-1]


def test_a_flood_that_stops_still_leaves_its_count() -> None:
    """The left-out records of a message that never comes back are counted in a line of
    their own, written with the next record of another message once the window is over."""
    stream = io.StringIO()
    now = [1000.0]
    limiter = RepeatLimiter(repeats=5, window=60, clock=lambda: now[0])
    logger = _logger(stream, limiter)
    for n in range(50):
        logger.error("bad input from %s", f"client-{n}")
    logger.warning("something else")
    assert "more like" not in stream.getvalue()  # the window is not over yet
    now[0] += 61
    logger.warning("something else again")
    lines = stream.getvalue().splitlines()
    assert "45 more like 'bad input from %s' in the last 60 s were not written" in lines[-2]
    assert lines[-1].endswith("something else again")
    now[0] += 61
    logger.warning("and more")
    assert stream.getvalue().count("more like") == 1  # said once
