"""Probe a whole host: every prober that applies, joined into one numbered device list.

Which sources apply:

- ``--sim PROFILE``: the simulated prober alone (the demo and the tests).
- ``--root PATH``: the file-based sources (sysfs) read under PATH; no library or tool is touched,
  so a captured tree shows exactly what it holds.
- otherwise: NVML, Level Zero and ``xpu-smi`` where present, Metal on macOS, and sysfs under ``/``.

A device seen by two sources (an Intel card through Level Zero and through sysfs, an NVIDIA card
through NVML and through PCI sysfs) is reported once, by the richer source: sources are listed
richest first and a later one's device with an already seen PCI bus id is dropped. When no
accelerator is found at all, the CPU is reported through psutil so every host can run CPU jobs.
"""

from __future__ import annotations

import platform
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from probers.base import Prober, ProberUnavailable
from probers.records import Device, DeviceSample, DeviceStatic, HostInfo, ProbeReport, normal_arch


@dataclass(frozen=True, slots=True)
class ProbeOptions:
    root: Path | None = None
    """Read file-based sources under this folder instead of ``/`` and skip libraries and tools."""
    sim: str | None = None
    """Use the simulated prober with this profile instead of any real source."""
    sim_seed: int = 0


def build_probers(options: ProbeOptions) -> list[Prober]:
    """The probers that apply to this host under ``options``, richest source first."""
    if options.sim is not None:
        from probers.sim import SimProber

        return [SimProber(options.sim, seed=options.sim_seed)]

    from probers.amdgpu import AmdgpuProber
    from probers.intel_sysfs import IntelSysfsProber
    from probers.nvidia_pci import NvidiaPciProber

    root = options.root or Path("/")
    probers: list[Prober] = []
    if options.root is None:
        from probers.level_zero import LevelZeroProber
        from probers.nvml import NvmlProber
        from probers.xpu_smi import XpuSmiProber

        probers += [NvmlProber(), LevelZeroProber(), XpuSmiProber()]
        if sys.platform == "darwin":
            from probers.apple import AppleProber

            probers.append(AppleProber())
    if options.root is not None or sys.platform.startswith("linux"):
        probers += [AmdgpuProber(root), IntelSysfsProber(root), NvidiaPciProber(root)]
    return probers


def _cpu_prober() -> Prober:
    from probers.cpu import CpuProber

    return CpuProber()


def local_host_info() -> HostInfo:
    """This machine's identity; memory and core count through psutil where it is installed."""
    try:
        from probers.cpu import host_info
    except ImportError:  # pragma: no cover - psutil is a dependency; keep probing without it
        return HostInfo(
            hostname=socket.gethostname(),
            os=platform.system().lower(),
            arch=normal_arch(platform.machine()),
            cpu_count=None,
            mem_total_bytes=None,
        )
    return host_info()


class HostProbe:
    """Discovers once, then samples on every :meth:`refresh`. Never raises for a device fault."""

    def __init__(self, probers: Sequence[Prober], host: HostInfo | None = None) -> None:
        self._candidates = list(probers)
        self._host = host
        self._active: list[Prober] = []
        self._statics: dict[str, DeviceStatic] = {}
        self._owner: dict[str, Prober] = {}
        self._order: list[str] = []
        self._last: dict[str, DeviceSample] = {}
        self.warnings: list[str] = []
        self._opened = False

    @classmethod
    def from_options(cls, options: ProbeOptions) -> HostProbe:
        probers = build_probers(options)
        host_info = getattr(probers[0], "host_info", None) if options.sim is not None else None
        return cls(probers, host=host_info() if host_info is not None else None)

    def open(self) -> None:
        """Run discovery on every candidate source and settle the host's device list."""
        if self._opened:
            return
        self._opened = True
        seen_pci: set[str] = set()
        for prober in self._candidates:
            self._discover_into(prober, seen_pci)
        if not self._order:
            self._discover_into(_cpu_prober(), seen_pci)

    def _discover_into(self, prober: Prober, seen_pci: set[str]) -> None:
        try:
            found = list(prober.discover())
        except ProberUnavailable:
            prober.close()
            return
        except Exception as exc:  # a broken source must not hide the others
            self.warnings.append(f"{prober.source}: discovery failed: {exc}")
            prober.close()
            return
        self.warnings.extend(getattr(prober, "warnings", ()))
        kept = False
        for static in found:
            if static.pci_bus_id is not None and static.pci_bus_id in seen_pci:
                continue
            if static.key in self._statics:
                continue
            if static.pci_bus_id is not None:
                seen_pci.add(static.pci_bus_id)
            self._statics[static.key] = static
            self._owner[static.key] = prober
            self._order.append(static.key)
            kept = True
        if kept:
            self._active.append(prober)
        else:
            prober.close()

    @property
    def settle_s(self) -> float:
        """How long after discovery the first sample is meaningful for every active source."""
        return max((float(getattr(p, "min_interval_s", 0.0)) for p in self._active), default=0.0)

    @property
    def probers(self) -> tuple[Prober, ...]:
        return tuple(self._active)

    def refresh(self) -> ProbeReport:
        """Sample every device. A source that fails marks its devices unhealthy, keeping facts."""
        self.open()
        for prober in self._active:
            try:
                samples = prober.sample()
            except Exception as exc:
                samples = [
                    DeviceSample(key=key, healthy=False, error=f"{prober.source}: {exc}")
                    for key, owner in self._owner.items()
                    if owner is prober
                ]
            for sample in samples:
                if self._owner.get(sample.key) is prober:
                    self._last[sample.key] = sample
        devices = tuple(
            Device(
                index=index,
                static=self._statics[key],
                sample=self._last.get(key, DeviceSample(key=key)),
            )
            for index, key in enumerate(self._order)
        )
        host = self._host or local_host_info()
        self._host = host
        return ProbeReport(host=host, devices=devices, warnings=tuple(self.warnings))

    def close(self) -> None:
        for prober in self._active:
            prober.close()
        self._active = []


def probe_once(options: ProbeOptions) -> ProbeReport:
    """Discover and sample once; the sources are closed before returning.

    Sources whose readings are rates get the interval they need between discovery and sample.
    """
    probe = HostProbe.from_options(options)
    try:
        probe.open()
        time.sleep(probe.settle_s)
        return probe.refresh()
    finally:
        probe.close()
