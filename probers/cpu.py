"""The host CPU as one device, through psutil, and the host's own facts (:func:`host_info`).

The CPU is the fallback accelerator every host has: one device ``cpu:0`` whose memory is the
system RAM. Utilization is ``psutil.cpu_percent(interval=None)``, the average since the previous
call: the prober primes it in ``discover``, and a sample taken less than :data:`MIN_WINDOW_S`
after the previous reading first waits out the rest of that window, so that a one-shot probe
reports a real average rather than the noise of a few microseconds. Temperature comes
from ``psutil.sensors_temperatures`` where the platform has it (Linux, FreeBSD): the package
sensor of ``coretemp`` (Intel) or ``k10temp`` (AMD). Power is not read.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from probers.records import DeviceSample, DeviceStatic, HostInfo, normal_arch

KEY = "cpu:0"
MIN_WINDOW_S = 0.1

# Sensor chips and the labels of their package (or die) reading, most preferred first.
_PACKAGE_SENSORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("coretemp", ("Package id 0", "Physical id 0")),
    ("k10temp", ("Tdie", "Tctl")),
    ("zenpower", ("Tdie", "Tctl")),
    ("cpu_thermal", ("",)),
    ("cpu-thermal", ("",)),
)


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's marketing name: ``/proc/cpuinfo`` on Linux, ``sysctl`` on macOS, else platform."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text(errors="replace").splitlines():
            label, sep, value = line.partition(":")
            if sep and label.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    if sys.platform == "darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            argv = ["sysctl", "-n", "machdep.cpu.brand_string"]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=2, check=True)
            if done.stdout.strip():
                return done.stdout.strip()
    return platform.processor() or f"{platform.machine() or 'unknown'} CPU"


def _package_sensor() -> Any | None:
    """The package temperature reading (a psutil ``shwtemp``), or ``None`` where there is none."""
    read = getattr(psutil, "sensors_temperatures", None)
    if read is None:
        return None
    try:
        sensors = read()
    except (OSError, RuntimeError, ValueError):
        return None
    for chip, labels in _PACKAGE_SENSORS:
        readings = sensors.get(chip) or []
        for label in labels:
            for reading in readings:
                if reading.label == label and reading.current is not None:
                    return reading
        if readings and readings[0].current is not None:
            return readings[0]
    return None


def _positive(value: float | None) -> float | None:
    return float(value) if value is not None and value > 0 else None


class CpuProber:
    """One device for the host CPU."""

    source = "psutil"

    def __init__(
        self,
        cpuinfo: Path = Path("/proc/cpuinfo"),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._cpuinfo = cpuinfo
        self._clock = clock
        self._sleep = sleep
        self._last_read_s: float | None = None

    def _cpu_percent(self) -> float:
        if self._last_read_s is not None:
            wait_s = MIN_WINDOW_S - (self._clock() - self._last_read_s)
            if wait_s > 0:
                self._sleep(wait_s)
        util = float(psutil.cpu_percent(interval=None))
        self._last_read_s = self._clock()
        return util

    def discover(self) -> Sequence[DeviceStatic]:
        self._cpu_percent()  # prime: the first call has nothing to compare with
        sensor = _package_sensor()
        return [
            DeviceStatic(
                key=KEY,
                vendor="cpu",
                backend="cpu",
                name=cpu_name(self._cpuinfo),
                source=self.source,
                arch=platform.machine() or None,
                unified_memory=True,
                mem_total_bytes=psutil.virtual_memory().total,
                mem_note="system RAM",
                compute_units=psutil.cpu_count(logical=False),
                temp_slowdown_c=_positive(sensor.high) if sensor is not None else None,
            )
        ]

    def sample(self) -> Sequence[DeviceSample]:
        try:
            memory = psutil.virtual_memory()
            util = self._cpu_percent()
        except (OSError, RuntimeError) as exc:
            return [DeviceSample(key=KEY, healthy=False, error=f"psutil failed: {exc}")]
        sensor = _package_sensor()
        return [
            DeviceSample(
                key=KEY,
                mem_used_bytes=memory.total - memory.available,
                util_pct=min(100.0, max(0.0, util)),
                temp_c=float(sensor.current) if sensor is not None else None,
            )
        ]

    def close(self) -> None:
        return None


def host_info() -> HostInfo:
    """This host's name, OS, architecture, logical CPU count and RAM."""
    try:
        mem_total: int | None = psutil.virtual_memory().total
    except (OSError, RuntimeError):
        mem_total = None
    return HostInfo(
        hostname=socket.gethostname() or platform.node(),
        os=platform.system().lower(),
        arch=normal_arch(platform.machine()),
        cpu_count=psutil.cpu_count(logical=True) or os.cpu_count(),
        mem_total_bytes=mem_total,
    )
