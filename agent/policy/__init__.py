"""Shoal's scheduling policy: one pure function of a snapshot (see the module docs)."""
