"""Gossip addresses: ``host:port`` and ``[v6]:port`` strings."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_address(address: str, *, allow_any_port: bool = False) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> (host, port); port 0 ("any") only for listening."""
    host, sep, port = address.rpartition(":")
    lowest = 0 if allow_any_port else 1
    if not sep or not host or not port.isdigit() or not lowest <= int(port) < 65536:
        raise ValueError(f"not a host:port address: {address!r}")
    return host.strip("[]"), int(port)
