"""Intel GPUs through the ``xpu-smi`` command-line tool (Intel XPU Manager), when it is installed.

Three commands, each under a timeout: ``xpu-smi discovery -j`` (the device list), ``xpu-smi
discovery -d N -j`` (one device's details, for its memory size and driver) and ``xpu-smi dump -d N
-m 0,1,2,3,4,5,18 -n 1`` (one line of telemetry). The parsers are pure functions of the text.

Units as the tool gives them: discovery writes byte counts as JSON *strings*
(``"memory_physical_size_byte": "51522830336"``); dump writes power in watts and memory used in
MiB; a sensor the device lacks is ``N/A``, which becomes ``None``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from probers.base import ProberUnavailable
from probers.intel_sysfs import intel_model, intel_name
from probers.records import DeviceSample, DeviceStatic

Runner = Callable[[Sequence[str], float], str]
"""Runs a command with a timeout in seconds and returns its stdout; raises on failure."""

DUMP_METRICS = "0,1,2,3,4,5,18"
MIB = 1024 * 1024
_MISSING = {"", "n/a", "na", "unknown", "none", "-"}


def run_command(argv: Sequence[str], timeout_s: float) -> str:
    """The default :data:`Runner`: ``subprocess.run`` with a timeout, failing on non-zero exit."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=True)
    return done.stdout


# --- parsers -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class XpuDevice:
    """One entry of ``xpu-smi discovery -j``."""

    device_id: int
    name: str | None
    pci_bus_id: str | None
    uuid: str | None
    pci_device_id: int | None
    drm_device: str | None


@dataclass(frozen=True, slots=True)
class XpuDeviceDetail:
    """The parts of ``xpu-smi discovery -d N -j`` that Shoal uses."""

    mem_total_bytes: int | None
    mem_free_bytes: int | None
    driver_version: str | None
    tiles: int | None


@dataclass(frozen=True, slots=True)
class XpuDumpRow:
    """One line of ``xpu-smi dump -m 0,1,2,3,4,5,18``, in Shoal units."""

    device_id: int
    util_pct: float | None
    power_mw: int | None
    freq_mhz: int | None
    temp_c: float | None
    mem_temp_c: float | None
    mem_util_pct: float | None
    mem_used_bytes: int | None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return None if text.lower() in _MISSING else text


def _int(value: Any) -> int | None:
    text = _text(value)
    if text is None:
        return None
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(float(text))
    except (ValueError, OverflowError):  # OverflowError: "inf"
        return None


def _float(value: Any) -> float | None:
    """A finite reading, or None ("N/A", "inf" and "nan" are no readings)."""
    text = _text(value)
    if text is None:
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _json_object(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError("xpu-smi output is nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError("xpu-smi output is not a JSON object")
    return data


def parse_discovery(text: str) -> list[XpuDevice]:
    """The devices of ``xpu-smi discovery -j``, in the tool's order."""
    entries = _json_object(text).get("device_list") or []
    if not isinstance(entries, list):
        raise ValueError("xpu-smi device_list is not a list")
    devices: list[XpuDevice] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        device_id = _int(entry.get("device_id"))
        if device_id is None:
            continue
        bdf = _text(entry.get("pci_bdf_address"))
        devices.append(
            XpuDevice(
                device_id=device_id,
                name=_text(entry.get("device_name")),
                pci_bus_id=bdf.lower() if bdf else None,
                uuid=_text(entry.get("uuid")),
                pci_device_id=_int(entry.get("pci_device_id")),
                drm_device=_text(entry.get("drm_device")),
            )
        )
    return devices


def parse_discovery_device(text: str) -> XpuDeviceDetail:
    """Memory size, free memory, driver version and tile count of ``discovery -d N -j``."""
    data = _json_object(text)
    return XpuDeviceDetail(
        mem_total_bytes=_int(data.get("memory_physical_size_byte")),
        mem_free_bytes=_int(data.get("memory_free_size_byte")),
        driver_version=_text(data.get("driver_version")),
        tiles=_int(data.get("number_of_tiles")),
    )


_DUMP_COLUMNS = {
    "deviceid": "device_id",
    "gpu utilization (%)": "util_pct",
    "gpu power (w)": "power_w",
    "gpu frequency (mhz)": "freq_mhz",
    "gpu core temperature (celsius degree)": "temp_c",
    "gpu memory temperature (celsius degree)": "mem_temp_c",
    "gpu memory utilization (%)": "mem_util_pct",
    "gpu memory used (mib)": "mem_used_mib",
}


def parse_dump(text: str) -> list[XpuDumpRow]:
    """The data lines of ``xpu-smi dump`` (CSV with a header line), matched by column name."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    try:  # csv.Error: a NUL, a field past the csv module's size limit
        table = list(csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True))
    except csv.Error as exc:
        raise ValueError(f"xpu-smi dump output is not CSV: {exc}") from None
    header = [_DUMP_COLUMNS.get(name.strip().lower(), "") for name in table[0]]
    if "device_id" not in header:
        raise ValueError("xpu-smi dump output has no DeviceId column")
    rows: list[XpuDumpRow] = []
    for cells in table[1:]:
        row = {name: cell.strip() for name, cell in zip(header, cells, strict=False) if name}
        device_id = _int(row.get("device_id"))
        if device_id is None:
            continue
        power_w = _float(row.get("power_w"))
        used_mib = _float(row.get("mem_used_mib"))
        rows.append(
            XpuDumpRow(
                device_id=device_id,
                util_pct=_float(row.get("util_pct")),
                power_mw=round(power_w * 1000) if power_w is not None else None,
                freq_mhz=_int(row.get("freq_mhz")),
                temp_c=_float(row.get("temp_c")),
                mem_temp_c=_float(row.get("mem_temp_c")),
                mem_util_pct=_float(row.get("mem_util_pct")),
                mem_used_bytes=round(used_mib * MIB) if used_mib is not None else None,
            )
        )
    return rows


# --- the prober --------------------------------------------------------------------------------


def _one_line(error: BaseException) -> str:
    if isinstance(error, subprocess.TimeoutExpired):
        return f"xpu-smi timed out after {error.timeout:g} s"
    if isinstance(error, subprocess.CalledProcessError):
        detail = (error.stderr or "").strip().splitlines()
        tail = f": {detail[-1]}" if detail else ""
        return f"xpu-smi exited with status {error.returncode}{tail}"
    text = str(error).strip().splitlines()
    return f"xpu-smi failed: {text[0] if text else type(error).__name__}"


_FAILURES = (OSError, subprocess.SubprocessError, ValueError)


class XpuSmiProber:
    """Intel GPUs as ``xpu-smi`` reports them. Keys are the tool's device UUIDs."""

    source = "xpu-smi"

    def __init__(
        self,
        runner: Runner = run_command,
        which: Callable[[str], str | None] = shutil.which,
        timeout_s: float = 10.0,
    ) -> None:
        self._runner = runner
        self._which = which
        self._timeout_s = timeout_s
        self._exe: str | None = None
        self._devices: list[tuple[str, XpuDevice]] = []

    def _run(self, *args: str) -> str:
        assert self._exe is not None
        return self._runner([self._exe, *args], self._timeout_s)

    def discover(self) -> Sequence[DeviceStatic]:
        exe = self._which("xpu-smi")
        if exe is None:
            raise ProberUnavailable("xpu-smi is not on PATH")
        self._exe = exe
        try:
            devices = parse_discovery(self._run("discovery", "-j"))
        except _FAILURES as error:
            raise ProberUnavailable(_one_line(error)) from error
        if not devices:
            raise ProberUnavailable("xpu-smi found no devices")
        self._devices = []
        statics: list[DeviceStatic] = []
        for index, device in enumerate(sorted(devices, key=lambda d: d.device_id)):
            try:
                detail: XpuDeviceDetail | None = parse_discovery_device(
                    self._run("discovery", "-d", str(device.device_id), "-j")
                )
            except _FAILURES:
                detail = None
            key = device.uuid or (
                f"pci:{device.pci_bus_id}" if device.pci_bus_id else f"xpu:{device.device_id}"
            )
            self._devices.append((key, device))
            pci_id = device.pci_device_id
            model = intel_model(pci_id) if pci_id is not None else None
            fallback = intel_name(pci_id) if pci_id is not None else "Intel GPU"
            statics.append(
                DeviceStatic(
                    key=key,
                    vendor="intel",
                    backend="xpu",
                    name=device.name or fallback,
                    source=self.source,
                    vendor_index=index,
                    uuid=device.uuid,
                    pci_bus_id=device.pci_bus_id,
                    arch=model.arch if model else None,
                    unified_memory=model.integrated if model else False,
                    mem_total_bytes=detail.mem_total_bytes if detail else None,
                    driver_version=detail.driver_version if detail else None,
                )
            )
        return statics

    def sample(self) -> Sequence[DeviceSample]:
        return [self._sample(key, device) for key, device in self._devices]

    def _sample(self, key: str, device: XpuDevice) -> DeviceSample:
        try:
            text = self._run("dump", "-d", str(device.device_id), "-m", DUMP_METRICS, "-n", "1")
            rows = [r for r in parse_dump(text) if r.device_id == device.device_id]
        except _FAILURES as error:
            return DeviceSample(key=key, healthy=False, error=_one_line(error))
        if not rows:
            return DeviceSample(key=key, healthy=False, error="xpu-smi dump gave no line")
        row = rows[-1]
        return DeviceSample(
            key=key,
            mem_used_bytes=row.mem_used_bytes,
            util_pct=row.util_pct,
            temp_c=row.temp_c,
            power_mw=row.power_mw,
        )

    def close(self) -> None:
        self._devices = []
