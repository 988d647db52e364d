"""Apple GPUs (and any Metal device on a Mac) through Metal, ``ioreg`` and ``system_profiler``.

- Metal, through pyobjc imported only when :func:`metal_devices` runs: name, registry id, whether
  memory is unified, and ``recommendedMaxWorkingSetSize``, the memory the GPU may use without
  paging. On unified-memory Macs that is Shoal's ``mem_total_bytes`` (not the whole RAM).
- ``ioreg -r -d 1 -c IOAccelerator``: the accelerator's ``PerformanceStatistics``, which hold the
  device utilization and the system memory in use by the GPU. Its entry id is Metal's registry id.
- ``system_profiler SPDisplaysDataType -json``: the model and the GPU core count.

Temperature and power are not read: on macOS they need root (``powermetrics``), so they are
``None`` and every sample says why in ``error``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from probers.base import ProberUnavailable
from probers.records import DeviceSample, DeviceStatic, Vendor

APPLE_NO_THERMAL_NOTE = "temperature and power need root on macOS (powermetrics); not read"

Runner = Callable[[Sequence[str], float], str]
"""Runs a command with a timeout in seconds and returns its stdout; raises when it fails."""

IOREG_ARGV = ("ioreg", "-r", "-d", "1", "-c", "IOAccelerator")
SYSTEM_PROFILER_ARGV = ("system_profiler", "SPDisplaysDataType", "-json")


def run_command(argv: Sequence[str], timeout_s: float) -> str:
    """The default runner: ``subprocess.run`` with a timeout, raising on a non-zero exit."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=True)
    return done.stdout


@dataclass(frozen=True, slots=True)
class MetalDevice:
    """What Metal tells of one device."""

    name: str
    registry_id: int
    unified_memory: bool
    recommended_working_set_bytes: int | None


def metal_devices() -> list[MetalDevice]:
    """Every Metal device, through pyobjc (imported here, never at module import)."""
    import Metal

    found = list(Metal.MTLCopyAllDevices() or [])
    if not found:
        default = Metal.MTLCreateSystemDefaultDevice()
        found = [default] if default is not None else []
    devices: list[MetalDevice] = []
    for device in found:
        working_set = int(device.recommendedMaxWorkingSetSize())
        devices.append(
            MetalDevice(
                name=str(device.name()),
                registry_id=int(device.registryID()),
                unified_memory=bool(device.hasUnifiedMemory()),
                recommended_working_set_bytes=working_set or None,
            )
        )
    return devices


# -- ioreg -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IoregAccelerator:
    """One ``IOAccelerator`` entry of ``ioreg`` and its ``PerformanceStatistics``."""

    class_name: str
    registry_id: int | None
    util_pct: float | None
    """``Device Utilization %``."""
    renderer_util_pct: float | None
    tiler_util_pct: float | None
    mem_used_bytes: int | None
    """``In use system memory``: system memory the GPU is using now."""
    mem_alloc_bytes: int | None
    """``Alloc system memory``: system memory allocated to the GPU."""
    model: str | None = None
    gpu_core_count: int | None = None


_ENTRY = re.compile(r"^[\s|]*\+-o\s+(\S+)\s+<class\s+([^,>]+)(?:,\s*id\s+(0x[0-9a-fA-F]+))?")
_PROPERTY = re.compile(r'^[\s|]*"([^"]+)"\s+=\s+(.*?)\s*$')
_STAT = re.compile(r'"([^"]+)"=(-?\d+|"[^"]*"|[A-Za-z]+)')


def _scalar(text: str) -> int | str:
    if text.startswith('"') and text.endswith('"'):
        return text[1:-1]
    try:
        return int(text)
    except ValueError:
        return text


def _int(value: int | str | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _pct(value: int | str | None) -> float | None:
    number = _int(value)
    return None if number is None or not 0 <= number <= 100 else float(number)


def parse_ioreg(text: str) -> list[IoregAccelerator]:
    """The accelerators in ``ioreg -r -d 1 -c IOAccelerator`` text output, in order."""
    entries: list[tuple[str, int | None, dict[str, int | str], dict[str, int | str]]] = []
    for line in text.splitlines():
        head = _ENTRY.match(line)
        if head:
            registry_id = int(head.group(3), 16) if head.group(3) else None
            entries.append((head.group(2).strip(), registry_id, {}, {}))
            continue
        prop = _PROPERTY.match(line)
        if prop is None or not entries:
            continue
        name, value = prop.group(1), prop.group(2)
        _, _, properties, stats = entries[-1]
        if name == "PerformanceStatistics":
            stats.update((k, _scalar(v)) for k, v in _STAT.findall(value))
        else:
            properties[name] = _scalar(value)
    return [
        IoregAccelerator(
            class_name=class_name,
            registry_id=registry_id,
            util_pct=_pct(stats.get("Device Utilization %")),
            renderer_util_pct=_pct(stats.get("Renderer Utilization %")),
            tiler_util_pct=_pct(stats.get("Tiler Utilization %")),
            mem_used_bytes=_int(stats.get("In use system memory")),
            mem_alloc_bytes=_int(stats.get("Alloc system memory")),
            model=model if isinstance(model := properties.get("model"), str) else None,
            gpu_core_count=_int(properties.get("gpu-core-count")),
        )
        for class_name, registry_id, properties, stats in entries
    ]


# -- system_profiler ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DisplayGpu:
    """One GPU of ``system_profiler SPDisplaysDataType -json``."""

    model: str
    """``sppci_model``, e.g. ``Apple M1``."""
    core_count: int | None
    """``sppci_cores``."""
    metal_family: str | None
    """The Metal GPU family (``apple7``) or support level (``metal3``)."""
    vendor: str | None
    """``Apple``, ``AMD``, ``Intel``... from ``spdisplays_vendor``."""


def _strip_prefix(value: Any, *prefixes: str) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    for prefix in prefixes:
        if value.startswith(prefix):
            value = value[len(prefix) :]
    return value or None


def parse_system_profiler(text: str) -> list[DisplayGpu]:
    """The GPUs in ``system_profiler SPDisplaysDataType -json`` output; ``[]`` if unreadable."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        return []
    items = data.get("SPDisplaysDataType") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return []
    gpus: list[DisplayGpu] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        model = item.get("sppci_model")
        if not isinstance(model, str) or not model:
            continue
        cores = item.get("sppci_cores")
        digits = str(cores) if isinstance(cores, str | int) else ""
        core_count = int(digits) if digits.isascii() and digits.isdigit() else None
        family = _strip_prefix(item.get("spdisplays_metalfamily"), "spdisplays_", "mtlgpufamily")
        if family is None:
            family = _strip_prefix(item.get("spdisplays_mtlgpufamilysupport"), "spdisplays_")
        vendor = _strip_prefix(item.get("spdisplays_vendor"), "sppci_vendor_", "spdisplays_")
        gpus.append(DisplayGpu(model, core_count, family, vendor))
    return gpus


# -- the prober --------------------------------------------------------------------------------


def _vendor_of(name: str) -> Vendor:
    lowered = name.lower()
    if lowered.startswith(("amd", "radeon")):
        return "amd"
    if lowered.startswith("intel"):
        return "intel"
    if lowered.startswith("nvidia"):
        return "nvidia"
    return "apple"


class AppleProber:
    """Metal devices on macOS. ``discover`` raises :class:`ProberUnavailable` anywhere else.

    ``runner`` runs ``ioreg`` and ``system_profiler``; ``metal`` lists Metal devices. Both are
    injectable so the prober can be exercised off a Mac.
    """

    source = "metal"

    def __init__(
        self,
        runner: Runner = run_command,
        metal: Callable[[], Sequence[MetalDevice]] = metal_devices,
        platform: str = sys.platform,
        timeout_s: float = 10.0,
    ) -> None:
        self._runner = runner
        self._metal = metal
        self._platform = platform
        self._timeout_s = timeout_s
        self._devices: list[tuple[DeviceStatic, MetalDevice]] = []

    def discover(self) -> Sequence[DeviceStatic]:
        if self._platform != "darwin":
            raise ProberUnavailable("Metal exists on macOS only")
        try:
            metal = list(self._metal())
        except ImportError as exc:
            raise ProberUnavailable(f"pyobjc Metal bindings not installed ({exc})") from exc
        if not metal:
            raise ProberUnavailable("Metal reports no device")
        displays = self._displays()
        per_vendor: dict[str, int] = {}
        self._devices = []
        for device in metal:
            display = self._display_for(device, displays, len(metal))
            vendor = _vendor_of(device.name or (display.model if display else ""))
            vendor_index = per_vendor.get(vendor, 0)
            per_vendor[vendor] = vendor_index + 1
            static = DeviceStatic(
                key=f"metal:{device.registry_id:#x}",
                vendor=vendor,
                backend="metal",
                name=device.name or (display.model if display else "Metal device"),
                source=self.source,
                vendor_index=vendor_index,
                arch=display.metal_family if display else None,
                unified_memory=device.unified_memory,
                mem_total_bytes=device.recommended_working_set_bytes,
                mem_note=(
                    "Metal recommendedMaxWorkingSetSize: the memory this GPU may use without"
                    " paging, not the whole unified memory"
                ),
                compute_units=display.core_count if display else None,
            )
            self._devices.append((static, device))
        return [static for static, _ in self._devices]

    def _displays(self) -> list[DisplayGpu]:
        try:
            text = self._runner(SYSTEM_PROFILER_ARGV, self._timeout_s)
        except (OSError, subprocess.SubprocessError):
            return []
        return parse_system_profiler(text)

    @staticmethod
    def _display_for(
        device: MetalDevice, displays: list[DisplayGpu], metal_count: int
    ) -> DisplayGpu | None:
        for display in displays:
            if display.model == device.name:
                return display
        if metal_count == 1 and len(displays) == 1:
            return displays[0]
        return None

    def sample(self) -> Sequence[DeviceSample]:
        try:
            accelerators = parse_ioreg(self._runner(IOREG_ARGV, self._timeout_s))
            failure = None
        except (OSError, subprocess.SubprocessError) as exc:
            accelerators, failure = [], f"ioreg failed: {exc}"
        by_id = {acc.registry_id: acc for acc in accelerators if acc.registry_id is not None}
        samples: list[DeviceSample] = []
        for static, device in self._devices:
            acc = by_id.get(device.registry_id)
            if acc is None and len(self._devices) == 1 and len(accelerators) == 1:
                acc = accelerators[0]
            if acc is None:
                error = failure or "no IOAccelerator entry for this device in ioreg"
                samples.append(DeviceSample(key=static.key, error=error))
                continue
            samples.append(
                DeviceSample(
                    key=static.key,
                    mem_used_bytes=acc.mem_used_bytes,
                    util_pct=acc.util_pct,
                    error=APPLE_NO_THERMAL_NOTE,
                )
            )
        return samples

    def close(self) -> None:
        self._devices = []
