"""Dedup claims (DESIGN §2): one delivery, one processing, one answer."""
