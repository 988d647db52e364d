"""Test hosts in network namespaces: :class:`bench.netlab.Lab` (the benchmarks use it too)."""

from __future__ import annotations

from bench.netlab import Lab, netns_available

__all__ = ["Lab", "netns_available"]
