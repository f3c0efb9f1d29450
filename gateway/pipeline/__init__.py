"""The four-stage priority pipeline on redis-durable."""
