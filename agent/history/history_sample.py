"""What a node samples into its history every second, from what the agent already holds.

Series (the measure's unit is in its name; the subject is a device key, a job id, or the host):

- per GPU, from the probers' latest sample: ``gpu.util_pct``, ``gpu.mem_used_bytes``,
  ``gpu.temp_c``, ``gpu.power_mw``, ``gpu.power_limit_mw``, ``gpu.mem_bw_pct`` (memory-bandwidth
  activity: NVML's memory utilization, amdgpu's ``mem_busy_percent`` or its ``gpu_metrics``
  UMC activity), ``gpu.sm_clock_mhz``, ``gpu.throttle`` (1 while the clocks are held down for
  a reason other than idling, else 0), ``gpu.pcie_rx_bytes_per_s`` and
  ``gpu.pcie_tx_bytes_per_s`` (NVML). A field a device has never given since the agent started
  is unsupported (the prober cannot read it there: amdgpu has no PCIe byte counters, an A10's
  NVML no clocks), never 0; once given, a missing reading is a gap, as is every field of a
  device that stopped answering.
- per host (psutil): ``host.cpu_pct``, ``host.mem_used_bytes``, ``host.swap_used_bytes``,
  ``host.net_rx_bytes_per_s``, ``host.net_tx_bytes_per_s``, ``host.disk_read_bytes_per_s``,
  ``host.disk_write_bytes_per_s`` (rates from the counters' change since the last sample).
- per link to each live peer (the subject is the peer's node id): ``link.rtt_ms``, the Vivaldi
  estimate of the round trip, and ``link.probe_rtt_ms``, the median of the recent measured
  probe round trips, from the gossip layer's own numbers (:func:`link_readings`).
- per job running here: ``job.progress_pct`` (what the job reports), and from its cgroup where
  the job has one (``cpu.stat``, ``memory.current``: two small reads) ``job.cpu_pct`` and
  ``job.mem_bytes``; unsupported where the job runs without a cgroup.

The pure parts (:func:`device_readings`, :func:`host_readings`, :func:`job_readings`) take
snapshots; :func:`read_host` and :func:`read_cgroup` are the two that read the system.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.history.history import SeriesKey, Unsupported
from probers.records import Device

GPU_FIELDS: Final = (
    "util_pct",
    "mem_used_bytes",
    "temp_c",
    "power_mw",
    "power_limit_mw",
    "mem_bw_pct",
    "sm_clock_mhz",
    "throttle",
    "pcie_rx_bytes_per_s",
    "pcie_tx_bytes_per_s",
)
_SAMPLE_FIELD: Final = {"throttle": "throttled"}
"""A series whose sample field is named otherwise."""
GPU_NOT_PROBED: Final[tuple[str, ...]] = ()
"""Fields worth keeping that no prober reads yet (recorded as unsupported, by name): none now."""
NOT_PROBED: Final = Unsupported("no prober of this device reads it yet")
NEVER_GIVEN: Final = Unsupported("this device has not given it")
NO_CGROUP: Final = Unsupported("the job runs without a cgroup of its own")

Readings = dict[SeriesKey, float | Unsupported | None]


class DeviceFields:
    """Remembers which fields each device has given, to tell unsupported from a gap."""

    def __init__(self) -> None:
        self.given: set[tuple[str, str]] = set()

    def readings(self, devices: Iterable[Device]) -> Readings:
        out: Readings = {}
        for device in devices:
            if device.static.backend == "cpu":
                continue  # the host series cover it
            key, sample = device.static.key, device.sample
            for name in GPU_FIELDS:
                value = getattr(sample, _SAMPLE_FIELD.get(name, name))
                series = SeriesKey("gpu." + name, key)
                if value is not None and sample.healthy:
                    self.given.add((key, name))
                    out[series] = float(value)
                elif (key, name) in self.given or not sample.healthy:
                    out[series] = None
                else:
                    out[series] = NEVER_GIVEN
            for name in GPU_NOT_PROBED:
                out[SeriesKey("gpu." + name, key)] = NOT_PROBED
        return out


@dataclass(frozen=True, slots=True)
class HostCounters:
    """One reading of the host's gauges and counters (``None``: psutil cannot tell here)."""

    at_s: float
    """A monotonic time, for the rates."""
    cpu_pct: float | None
    mem_used_bytes: int | None
    swap_used_bytes: int | None
    net_rx_bytes: int | None
    net_tx_bytes: int | None
    disk_read_bytes: int | None
    disk_write_bytes: int | None


_RATES: Final = (
    ("net_rx_bytes", "host.net_rx_bytes_per_s"),
    ("net_tx_bytes", "host.net_tx_bytes_per_s"),
    ("disk_read_bytes", "host.disk_read_bytes_per_s"),
    ("disk_write_bytes", "host.disk_write_bytes_per_s"),
)


def host_readings(before: HostCounters | None, now: HostCounters) -> Readings:
    """The host's series from two readings (the rates need both: the first sample has none)."""
    out: Readings = {
        SeriesKey("host.cpu_pct"): now.cpu_pct,
        SeriesKey("host.mem_used_bytes"): _num(now.mem_used_bytes),
        SeriesKey("host.swap_used_bytes"): _num(now.swap_used_bytes),
    }
    for counter, name in _RATES:
        value = getattr(now, counter)
        if value is None:
            out[SeriesKey(name)] = Unsupported("psutil cannot read it on this host")
            continue
        previous = None if before is None else getattr(before, counter)
        span_s = 0.0 if before is None else now.at_s - before.at_s
        ok = previous is not None and span_s > 0 and value >= previous  # a counter reset: gap
        out[SeriesKey(name)] = (value - previous) / span_s if ok and previous is not None else None
    return out


def _num(value: int | None) -> float | None:
    return None if value is None else float(value)


def read_host() -> HostCounters:
    """The host's counters now (psutil; each a small read of /proc on Linux)."""
    import psutil

    def attempt(read: object) -> object:
        try:
            return read() if callable(read) else None
        except (OSError, RuntimeError, psutil.Error):
            return None

    memory: object = attempt(psutil.virtual_memory)
    swap: object = attempt(psutil.swap_memory)
    # nowrap=False: the raw totals (a third cheaper each second); a counter that went back is a
    # gap in the rates (host_readings), not a correction psutil keeps state for
    net: object = attempt(lambda: psutil.net_io_counters(nowrap=False))
    disk: object = attempt(lambda: psutil.disk_io_counters(nowrap=False))
    cpu = attempt(lambda: psutil.cpu_percent(interval=None))
    return HostCounters(
        at_s=time.monotonic(),
        cpu_pct=float(cpu) if isinstance(cpu, int | float) else None,
        mem_used_bytes=getattr(memory, "used", None),
        swap_used_bytes=getattr(swap, "used", None),
        net_rx_bytes=getattr(net, "bytes_recv", None),
        net_tx_bytes=getattr(net, "bytes_sent", None),
        disk_read_bytes=getattr(disk, "read_bytes", None),
        disk_write_bytes=getattr(disk, "write_bytes", None),
    )


@dataclass(frozen=True, slots=True)
class CgroupCounters:
    at_s: float
    cpu_usec: int | None
    mem_bytes: int | None


def read_cgroup(folder: Path) -> CgroupCounters:
    """A job's cgroup (v2): CPU time used and memory charged now."""
    cpu_usec = mem = None
    try:
        for line in (folder / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec":
                cpu_usec = int(value)
    except (OSError, ValueError):
        pass
    with contextlib.suppress(OSError, ValueError):
        mem = int((folder / "memory.current").read_text())
    return CgroupCounters(time.monotonic(), cpu_usec, mem)


def job_readings(
    progress: Mapping[str, float | None],
    cgroups: Mapping[str, tuple[CgroupCounters | None, CgroupCounters | None]],
) -> Readings:
    """Each running job's progress (``None``: it reports none yet, a gap) and, where it has a
    cgroup (``cgroups[job] = (before, now)``), its CPU (percent of one core) and memory."""
    out: Readings = {}
    for job_id, fraction in progress.items():
        out[SeriesKey("job.progress_pct", job_id)] = None if fraction is None else fraction * 100
        before, now = cgroups.get(job_id, (None, None))
        if now is None:
            out[SeriesKey("job.cpu_pct", job_id)] = NO_CGROUP
            out[SeriesKey("job.mem_bytes", job_id)] = NO_CGROUP
            continue
        out[SeriesKey("job.mem_bytes", job_id)] = _num(now.mem_bytes)
        cpu: float | None = None
        if before is not None and before.cpu_usec is not None and now.cpu_usec is not None:
            span_s = now.at_s - before.at_s
            if span_s > 0 and now.cpu_usec >= before.cpu_usec:
                cpu = (now.cpu_usec - before.cpu_usec) / 1e6 / span_s * 100
        out[SeriesKey("job.cpu_pct", job_id)] = cpu
    return out


def link_readings(rtts: Mapping[str, tuple[float | None, float | None]]) -> Readings:
    """Each peer's ``(Vivaldi estimate, measured median)`` round trip in seconds, as series in
    milliseconds (``None``: not known yet, a gap)."""
    out: Readings = {}
    for peer, (estimate_s, measured_s) in rtts.items():
        out[SeriesKey("link.rtt_ms", peer)] = None if estimate_s is None else estimate_s * 1000
        out[SeriesKey("link.probe_rtt_ms", peer)] = (
            None if measured_s is None else measured_s * 1000
        )
    return out


class NodeSampler:
    """Every series of this node, one second at a time (keeps what the rates need)."""

    def __init__(self) -> None:
        self.devices = DeviceFields()
        self._host: HostCounters | None = None
        self._cgroups: dict[str, CgroupCounters] = {}

    def sample(
        self,
        devices: Iterable[Device],
        progress: Mapping[str, float | None],
        cgroup_folders: Mapping[str, Path | None],
    ) -> Readings:
        """``progress``: each job running here; ``cgroup_folders``: its cgroup, if it has one."""
        host = read_host()
        out = self.devices.readings(devices)
        out.update(host_readings(self._host, host))
        self._host = host
        pairs: dict[str, tuple[CgroupCounters | None, CgroupCounters | None]] = {}
        for job_id, folder in cgroup_folders.items():
            if folder is not None:
                now = read_cgroup(folder)
                pairs[job_id] = (self._cgroups.get(job_id), now)
                self._cgroups[job_id] = now
        for gone in set(self._cgroups) - set(cgroup_folders):
            del self._cgroups[gone]
        out.update(job_readings(progress, pairs))
        return out
