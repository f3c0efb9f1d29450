"""Defences shared by the inbound adapters (the brute-force barrier on bad signatures)."""
