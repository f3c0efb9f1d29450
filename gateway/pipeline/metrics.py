"""Prometheus metrics of the pipeline, labelled by stage."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from gateway.metrics import PlainCounter

# Bumped on every accepted webhook: counted without prometheus-client's lock.
ENQUEUED = PlainCounter("gateway_pipeline_enqueued_total", "items enqueued into a stage",
                        ["stage"])
COMPLETED = Counter("gateway_pipeline_completed_total", "stage completions", ["stage"])
FAILED = Counter("gateway_pipeline_failed_total", "handler failures", ["stage"])
DELAYED = Counter("gateway_pipeline_delayed_total", "items told to wait (a spent budget)",
                  ["stage"])
RECLAIMED = Counter("gateway_pipeline_reclaimed_total", "expired leases reclaimed", ["stage"])
DEAD_LETTERED = Counter("gateway_pipeline_dead_lettered_total", "items dead-lettered",
                        ["stage"])
DEPTH = Gauge("gateway_pipeline_queue_depth", "items per stage and state", ["stage", "state"])
HANDLER_SECONDS = Histogram(
    "gateway_pipeline_handler_seconds", "stage handler latency", ["stage"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
SEARCH_CACHE = Counter("gateway_search_cache_total", "search answer cache lookups", ["result"])
