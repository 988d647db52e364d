"""Test hosts in network namespaces: one bridge "switch" namespace, one namespace per host.

Addresses come from 198.18.0.0/15 (reserved for benchmarking). Everything is created under a
per-run prefix and torn down by :meth:`Lab.close`, also after a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=10)


def netns_available() -> tuple[bool, str]:
    """Whether this machine lets us create namespaces, and why not."""
    if shutil.which("ip") is None:
        return False, "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return False, "creating network namespaces needs root"
    probe = f"shoal-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return False, f"ip netns add failed: {exc.stderr.strip()}"
    _ip("netns", "del", probe)
    return True, ""


@dataclass
class Lab:
    """``hosts`` namespaces on one bridge; host i has address 198.18.0.(i+1)/24."""

    hosts: int
    prefix: str = field(default_factory=lambda: f"sh{os.getpid() % 100000}")
    created: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def host(self, i: int) -> str:
        return f"{self.prefix}-h{i}"

    def address(self, i: int) -> str:
        return f"198.18.0.{i + 1}"

    def _link(self, i: int) -> str:
        return f"{self.prefix}p{i}"

    def open(self) -> Lab:
        _ip("netns", "add", self.switch)
        self.created.append(self.switch)
        _ip("link", "add", "br0", "type", "bridge", netns=self.switch)
        _ip("link", "set", "br0", "up", netns=self.switch)
        _ip("link", "set", "lo", "up", netns=self.switch)
        for i in range(self.hosts):
            ns = self.host(i)
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("link", "set", "lo", "up", netns=ns)
            _ip("link", "add", "eth0", "type", "veth", "peer", "name", self._link(i), netns=ns)
            _ip("link", "set", self._link(i), "netns", self.switch, netns=ns)
            _ip("link", "set", self._link(i), "master", "br0", netns=self.switch)
            _ip("link", "set", self._link(i), "up", netns=self.switch)
            _ip("addr", "add", f"{self.address(i)}/24", "dev", "eth0", netns=ns)
            _ip("link", "set", "eth0", "up", netns=ns)
        return self

    def cut(self, i: int) -> None:
        """Partition host i: its port on the switch goes down."""
        _ip("link", "set", self._link(i), "down", netns=self.switch)

    def heal(self, i: int) -> None:
        _ip("link", "set", self._link(i), "up", netns=self.switch)

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host i's namespace."""
        return ["ip", "netns", "exec", self.host(i), *argv]

    def close(self) -> None:
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10, check=False)
        self.created.clear()
