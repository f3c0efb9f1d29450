"""Process-wide Prometheus metrics shared across components (component-specific metrics live
with their component)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

HTTP_REQUESTS = Counter(
    "gateway_http_requests_total", "HTTP requests answered", ["route", "status"]
)
HTTP_LATENCY = Histogram(
    "gateway_http_request_seconds", "HTTP request handling time", ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
