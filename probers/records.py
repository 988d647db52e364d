"""Typed device records shared by every prober.

Static facts (what a device *is*) are kept apart from dynamic samples (what it is *doing*), so that
inventory can be gossiped rarely and telemetry often. Units are in the field names; a value the
hardware does not tell is ``None``, never ``0``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Vendor = Literal["nvidia", "amd", "intel", "apple", "cpu", "sim"]
Backend = Literal["cuda", "rocm", "xpu", "metal", "cpu"]
LinkKind = Literal["nvlink", "xgmi", "pcie"]


@dataclass(frozen=True, slots=True)
class Link:
    """A direct interconnect from one device to a peer device on the same host."""

    peer: str
    """The peer device's ``key`` (its UUID where the vendor has one)."""
    kind: LinkKind
    bandwidth_mbps: int | None = None
    """Link bandwidth in megabits per second, when the source tells it."""
    detail: str | None = None
    """Source-specific detail: NVML topology level (``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``),
    the number of NVLink lanes, or KFD hop count and weight."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG instance carved out of an NVIDIA GPU."""

    uuid: str
    name: str | None
    mem_total_bytes: int | None


@dataclass(frozen=True, slots=True)
class DeviceStatic:
    """Facts about one device that do not change while the host is up.

    ``key`` is stable and unique on the host: the vendor UUID where there is one, else a
    source-qualified id such as ``drm:card0``. ``vendor_index`` is the device's position in its own
    vendor's enumeration, which is what ``ROCR_VISIBLE_DEVICES`` and ``ZE_AFFINITY_MASK`` take.
    """

    key: str
    vendor: Vendor
    backend: Backend
    name: str
    source: str
    """The prober that found it: ``nvml``, ``amdgpu-sysfs``, ``xe-sysfs``, ``xpu-smi``, ..."""
    vendor_index: int = 0
    uuid: str | None = None
    pci_bus_id: str | None = None
    arch: str | None = None
    compute_capability: str | None = None
    """NVIDIA ``major.minor``; AMD gfx target (``gfx90a``); ``None`` elsewhere."""
    unified_memory: bool = False
    mem_total_bytes: int | None = None
    """Memory the GPU can really use. For unified-memory devices that includes shared memory."""
    mem_note: str | None = None
    """How ``mem_total_bytes`` was arrived at when it is not plain dedicated VRAM."""
    compute_units: int | None = None
    temp_slowdown_c: float | None = None
    """The temperature at which this device starts to throttle, when it tells."""
    links: tuple[Link, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()
    driver_version: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """What one device is doing now. ``healthy`` is False when the device stopped answering."""

    key: str
    mem_used_bytes: int | None = None
    util_pct: float | None = None
    temp_c: float | None = None
    power_mw: int | None = None
    power_limit_mw: int | None = None
    healthy: bool = True
    error: str | None = None
    """Why the device is unhealthy or why a reading is missing, in one line."""
    mem_bw_pct: float | None = None
    """Memory-bandwidth activity: NVML's memory utilization, amdgpu's ``mem_busy_percent`` or
    its ``gpu_metrics`` memory-controller (UMC) activity."""
    sm_clock_mhz: float | None = None
    """The graphics/SM clock now."""
    throttled: bool | None = None
    """Whether the clocks are held down now for a reason other than idling (power, heat, a
    slowdown the driver applies); ``None`` where the device does not tell."""
    pcie_rx_bytes_per_s: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_link_bytes_per_s: float | None = None
    """The PCIe link's bandwidth each way at its current generation and width."""


@dataclass(frozen=True, slots=True)
class Device:
    """A device's static facts joined with its latest sample, numbered host-wide."""

    index: int
    static: DeviceStatic
    sample: DeviceSample

    def to_json(self) -> dict[str, Any]:
        """The exact device object of ``shoal probe --json``."""
        s, d = self.static, self.sample
        return {
            "index": self.index,
            "vendor": s.vendor,
            "backend": s.backend,
            "name": s.name,
            "uuid": s.uuid,
            "pci_bus_id": s.pci_bus_id,
            "arch": s.arch,
            "unified_memory": s.unified_memory,
            "mem_total_bytes": s.mem_total_bytes,
            "mem_used_bytes": d.mem_used_bytes,
            "util_pct": d.util_pct,
            "temp_c": d.temp_c,
            "power_mw": d.power_mw,
            "power_limit_mw": d.power_limit_mw,
            "links": [
                {"peer": link.peer, "kind": link.kind, "bandwidth_mbps": link.bandwidth_mbps}
                for link in s.links
            ],
        }


_ARCH_NAMES = {"amd64": "x86_64", "x64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}


def normal_arch(machine: str) -> str:
    """One name per CPU architecture whatever the OS says (Linux ``aarch64`` and macOS
    ``arm64`` are ``arm64``; Windows ``AMD64`` is ``x86_64``); others lower-cased as given."""
    lowered = machine.lower()
    return _ARCH_NAMES.get(lowered, lowered)


@dataclass(frozen=True, slots=True)
class HostInfo:
    hostname: str
    os: str
    arch: str
    cpu_count: int | None
    mem_total_bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "os": self.os,
            "arch": self.arch,
            "cpu_count": self.cpu_count,
            "mem_total_bytes": self.mem_total_bytes,
        }


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """One host's view of itself: the host and every device every applicable prober found."""

    host: HostInfo
    devices: tuple[Device, ...]
    warnings: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host.to_json(), "devices": [d.to_json() for d in self.devices]}
