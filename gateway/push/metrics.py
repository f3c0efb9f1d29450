"""Prometheus metrics of the push channel: how many streams, what they were sent, why they
ended, and whether signals are getting through."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

STREAMS = Gauge("gateway_push_streams", "open SSE streams in this process")
ROWS_SENT = Counter("gateway_push_rows_sent_total", "feed rows written to SSE streams")
STREAM_CLOSED = Counter("gateway_push_streams_closed_total",
                        "SSE streams the server closed, by reason", ["reason"])
SIGNALS = Counter("gateway_push_signals_total", "PUBLISH of push signals, by result",
                  ["result"])
SIGNALS_UP = Gauge("gateway_push_signals_up", "1 while the push subscriber is connected")
FEED_READS = Counter("gateway_push_feed_reads_total",
                     "feed reads by the hub, by cause", ["cause"])
FEED_SWEPT = Counter("gateway_push_feed_swept_total",
                     "pending feed rows numbered by the sweep: their writer stopped after"
                     " its commit, before numbering them")
