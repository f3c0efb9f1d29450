"""Durable feed in PostgreSQL plus push: signals on redis-cache."""
