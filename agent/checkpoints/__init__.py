"""Checkpoint files and their transfer between agents (later: the content store)."""
