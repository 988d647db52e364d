"""Test hosts in network namespaces: one bridge "switch" namespace, one namespace per host.

Addresses come from 198.18.0.0/15 (reserved for benchmarking). Everything is created under a
per-run prefix and torn down by :meth:`Lab.close`, also after a failure. The tests use it
(``tests/netns.py``) and so do the benchmarks that need real links: :meth:`Lab.shape` throttles a
host's link in both directions with ``tc``'s token bucket, :meth:`Lab.link_bytes` reads its
interface counters, and :meth:`Lab.inside_switch` lets this process itself talk to every host
(through an address on the bridge), without touching the machine's own namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

_CLONE_NEWNET = 0x40000000


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=10)


def _tc(netns: str, *args: str) -> None:
    command = ["ip", "netns", "exec", netns, "tc", *args]
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


def tc_available() -> tuple[bool, str]:
    """Whether ``tc`` can put a token bucket on a link here, and why not."""
    ok, why = netns_available()
    if not ok:
        return ok, why
    if shutil.which("tc") is None:
        return False, "the tc command (iproute2) is not installed"
    probe = f"shoal-tc-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("link", "set", "lo", "up", netns=probe)
        _tc(
            probe,
            "qdisc",
            "add",
            "dev",
            "lo",
            "root",
            "tbf",
            "rate",
            "100mbit",
            "burst",
            "256kb",
            "latency",
            "50ms",
        )
    except subprocess.CalledProcessError as exc:
        return False, f"tc tbf refused: {exc.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10, check=False)
    return True, ""


@dataclass(frozen=True, slots=True)
class LinkBytes:
    """What one host's link carried, from its own end (``eth0`` in the host's namespace)."""

    rx_bytes: int
    tx_bytes: int


@dataclass
class Lab:
    """``hosts`` namespaces on one bridge; host i has address 198.18.``subnet``.(i+1)/24.

    ``subnet`` lets two labs that each reach their hosts from outside (:meth:`inside_switch`) use
    different addresses; labs whose hosts only talk among themselves may all use 0.
    """

    hosts: int
    prefix: str = field(default_factory=lambda: f"sh{os.getpid() % 100000}")
    subnet: int = 0
    created: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def host(self, i: int) -> str:
        return f"{self.prefix}-h{i}"

    def address(self, i: int) -> str:
        return f"198.18.{self.subnet}.{i + 1}"

    @property
    def switch_address(self) -> str:
        """The bridge's own address (:meth:`inside_switch` talks from it)."""
        return f"198.18.{self.subnet}.254"

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

    def shape(
        self, i: int, mbit: float, burst_bytes: int = 256 << 10, down_mbit: float | None = None
    ) -> None:
        """Host i's link carries at most ``mbit`` Mbit/s each way (``down_mbit``: what it
        receives, when that differs): a token bucket on ``eth0`` (what the host sends) and on
        its port on the switch (what it receives)."""
        burst = f"{burst_bytes}b"
        for ns, dev, rate_mbit in (
            (self.host(i), "eth0", mbit),
            (self.switch, self._link(i), mbit if down_mbit is None else down_mbit),
        ):
            rate = f"{int(rate_mbit * 1000)}kbit"
            _tc(ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
                "latency", "50ms")  # fmt: skip

    def link_bytes(self, i: int) -> LinkBytes:
        """Host i's interface counters (the kernel's, whatever sent the bytes)."""
        out = subprocess.run(
            ["ip", "-j", "-s", "-n", self.host(i), "link", "show", "dev", "eth0"],
            check=True,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        stats = json.loads(out)[0]["stats64"]
        return LinkBytes(int(stats["rx"]["bytes"]), int(stats["tx"]["bytes"]))

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host i's namespace."""
        return ["ip", "netns", "exec", self.host(i), *argv]

    @contextlib.contextmanager
    def inside_switch(self) -> Iterator[None]:
        """This thread (and the threads it starts meanwhile) in the switch's namespace, with the
        bridge's own address up: every host is reachable from here; the machine's own interfaces
        and loopback are not. Back in the namespace it came from on the way out."""
        _ip("addr", "replace", f"{self.switch_address}/24", "dev", "br0", netns=self.switch)
        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open("/proc/self/ns/net", os.O_RDONLY)
        try:
            target = os.open(f"/run/netns/{self.switch}", os.O_RDONLY)
            try:
                if libc.setns(target, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the switch's namespace")
            finally:
                os.close(target)
            try:
                yield
            finally:
                if libc.setns(own, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back into this process's namespace")
        finally:
            os.close(own)

    def close(self) -> None:
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10, check=False)
        self.created.clear()
