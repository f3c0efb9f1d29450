"""Dedup claims: one delivery, one processing, one answer."""
