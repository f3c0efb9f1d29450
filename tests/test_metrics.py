"""The HTTP metrics' collector exports what prometheus-client's own Counter and Histogram
export for the same observations (names, labels, buckets, counts, sums, ``_created``)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest

from gateway.metrics import LATENCY_BUCKETS, HttpMetrics, PlainCounter

OBSERVED = [("/v1/webhooks/{source}", 202, 0.0004), ("/v1/webhooks/{source}", 202, 0.001),
            ("/v1/webhooks/{source}", 401, 0.0031), ("/healthz", 200, 0.7),
            ("/v1/webhooks/{source}", 202, 3.0), ("unmatched", 404, 2.5)]


def _text(registry: CollectorRegistry) -> list[str]:
    """The exposition's lines, with the ``_created`` values (a clock reading) blanked."""
    lines = generate_latest(registry).decode().splitlines()
    return [line.rsplit(" ", 1)[0] if "_created{" in line else line for line in lines]


def test_same_exposition_as_prometheus_client() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    requests = Counter("gateway_http_requests", "HTTP requests answered", ["route", "status"],
                       registry=theirs)
    latency = Histogram("gateway_http_request_seconds", "HTTP request handling time",
                        ["route"], buckets=LATENCY_BUCKETS, registry=theirs)
    metrics = HttpMetrics()
    ours.register(metrics)
    started = time.time()
    for route, status, seconds in OBSERVED:
        requests.labels(route, str(status)).inc()
        latency.labels(route).observe(seconds)
        metrics.observe(route, status, seconds)
    # Same series in the same order, once each route and status first appear in the same
    # order (prometheus-client keeps its children in creation order too).
    assert _text(ours) == _text(theirs)
    created = [line for line in generate_latest(ours).decode().splitlines()
               if "_created{" in line]
    assert len(created) == 4 + 3  # one per (route, status), one per route
    assert all(started <= float(line.rsplit(" ", 1)[1]) <= time.time() for line in created)


def test_a_plain_counter_exports_what_a_counter_does() -> None:
    theirs = CollectorRegistry()
    counter = Counter("gateway_test_things_total", "things", ["stage"], registry=theirs)
    ours = PlainCounter("gateway_test_things_total", "things", ["stage"])
    try:
        for stage, amount in [("store", 1), ("chunk", 3), ("store", 2.5), ("embed", 0)]:
            counter.labels(stage).inc(amount)
            ours.labels(stage).inc(amount)
        lines = [line for line in _text(REGISTRY) if "gateway_test_things" in line]
        assert lines == _text(theirs)
        with pytest.raises(ValueError):
            ours.labels("store").inc(-1)
        with pytest.raises(ValueError):
            ours.labels("store", "extra")
    finally:
        REGISTRY.unregister(ours)
