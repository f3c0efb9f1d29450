"""Process-wide Prometheus metrics shared across components (component-specific metrics live
with their component), and ``PlainCounter`` for counters bumped on the ingest path.

The two metrics of every HTTP request are counted in plain numbers and exported through a
collector: prometheus-client's children take a lock per increment and walk the histogram's
buckets in Python, ~4 µs per request on the ingest path, against ~1 µs for this. The names,
labels, buckets and ``_created`` series are prometheus-client's own."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import REGISTRY
from prometheus_client import metrics as _client_metrics
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class HttpMetrics(Collector):
    """``gateway_http_requests_total{route, status}`` (requests answered) and
    ``gateway_http_request_seconds{route}`` (their handling time), observed by the routes
    (``gateway.api.routes``) on the event loop's thread; ``collect`` reads a snapshot."""

    def __init__(self, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        self._bounds = (*buckets, float("inf"))
        self._les = [floatToGoString(bound) for bound in self._bounds]
        self._requests: dict[tuple[str, int], int] = {}
        # route -> a count per bucket (not cumulative), then the sum of the seconds
        self._latency: dict[str, list[float]] = {}
        self._created: dict[tuple[str, int] | str, float] = {}

    def observe(self, route: str, status: int, seconds: float) -> None:
        key = (route, status)
        requests = self._requests
        if key in requests:
            requests[key] += 1
        else:
            self._first(key)
        row = self._latency[route]
        row[bisect_left(self._bounds, seconds)] += 1
        row[-1] += seconds

    def _first(self, key: tuple[str, int]) -> None:
        route = key[0]
        now = time.time()
        if route not in self._latency:
            self._created[route] = now
            self._latency[route] = [0.0] * (len(self._bounds) + 1)
        self._created[key] = now
        self._requests[key] = 1

    def collect(self) -> Iterator[Metric]:
        created = getattr(_client_metrics, "_use_created", True)
        requests = CounterMetricFamily("gateway_http_requests_total", "HTTP requests answered",
                                       labels=("route", "status"))
        for (route, status), count in list(self._requests.items()):
            requests.add_metric((route, str(status)), count,
                                self._created[route, status] if created else None)
        yield requests
        latency = HistogramMetricFamily("gateway_http_request_seconds",
                                        "HTTP request handling time", labels=("route",))
        for route, row in list(self._latency.items()):
            counts, total, cumulative = row[:-1], row[-1], 0.0
            buckets: list[tuple[str, float]] = []
            for le, hits in zip(self._les, counts, strict=True):
                cumulative += hits
                buckets.append((le, cumulative))
            latency.add_metric((route,), buckets, total)
            if created:
                latency.samples.append(Sample("gateway_http_request_seconds_created",
                                              {"route": route}, self._created[route]))
        yield latency


class _CountChild:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class PlainCounter(Collector):
    """A labelled counter exported as prometheus-client's ``Counter`` is (``_total`` and
    ``_created`` per child, children in creation order), counted in a plain attribute: an
    ``inc`` on the event loop's thread without the lock and checks of the client's (~1 µs;
    the pipeline's enqueue count is bumped on every accepted webhook)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name, self.documentation = name.removesuffix("_total"), documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], _CountChild] = {}
        REGISTRY.register(self)

    def labels(self, *values: str) -> _CountChild:
        key = tuple(map(str, values))
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}")
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = _CountChild()
        return child

    def collect(self) -> Iterator[Metric]:
        created = getattr(_client_metrics, "_use_created", True)
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            family.add_metric(key, child.value, child.created if created else None)
        yield family


HTTP = HttpMetrics()
REGISTRY.register(HTTP)
