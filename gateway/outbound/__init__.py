"""Outbound bot messages: rate-limited, retried, dead-lettered, never dropped silently."""
