"""Errors, parsing and paths every room may use; no Shoal import."""
