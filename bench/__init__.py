"""Benchmarks: ``python -m bench.<name> ... --json`` prints one JSON object."""
