"""Delivery metrics (``/metrics``): rows delivered and failed attempts per destination type,
rows given up on, and how far behind the subscriptions this process holds are."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

DELIVERED = Counter("gateway_notifications_delivered_total",
                    "rows delivered to subscriptions (a 2xx, or a chat message accepted)",
                    ["type"])
FAILED = Counter("gateway_notifications_failed_total",
                 "delivery attempts that failed (retried on the schedule)", ["type"])
GIVEN_UP = Counter("gateway_notifications_given_up_total",
                   "rows recorded as failures after the retry schedule and skipped", ["type"])
LAG = Gauge("gateway_notifications_lag_rows",
            "rows the subscriptions this process holds are behind their topics' heads")
HELD = Gauge("gateway_notifications_held_subscriptions",
             "subscriptions this process delivers (their partitions' leases held)")
