"""PostgreSQL: the system of record (conversations, feed, run journal, documents)."""
