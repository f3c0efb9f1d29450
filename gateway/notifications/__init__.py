"""Notifications out: publishing events of one's own, subscriptions (PostgreSQL is their
record) and their delivery to HTTP endpoints and chats, one feed offset driving each."""
