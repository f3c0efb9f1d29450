"""The four-stage priority pipeline on redis-durable (DESIGN §3)."""
