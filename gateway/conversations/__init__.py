"""Conversations shared by the chat adapters: one active conversation per chat in PostgreSQL,
a pointer to it in redis-cache, messages as feed rows, replies from a pluggable handler."""
