"""This host's devices as the agent holds them: the probe, its latest report, the simulated load.

``HostDevices`` opens the probe once, refreshes it on demand (in a thread for real hardware, at
once for the simulated prober, which only computes), and answers the runner's
``LocalDevices`` seam: the accelerators a job may be given, and the load the jobs on a
simulated device put on it, shares of one GPU added up (so the demo's telemetry shows busy GPUs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from probers.host import HostProbe, ProbeOptions
from probers.records import DeviceStatic, ProbeReport


class HostDevices:
    def __init__(self, sim: str | None, sim_seed: int) -> None:
        self.probe = HostProbe.from_options(ProbeOptions(sim=sim, sim_seed=sim_seed))
        self.probe.open()
        self.report: ProbeReport = self.probe.refresh()
        self._sim: Any = next((p for p in self.probe.probers if p.source == "sim"), None)

    async def refresh(self) -> ProbeReport:
        if self._sim is None:
            self.report = await asyncio.to_thread(self.probe.refresh)
        else:
            self.report = self.probe.refresh()
        return self.report

    def statics(self) -> list[DeviceStatic]:
        return [d.static for d in self.report.devices if d.static.backend != "cpu"]

    def set_load(self, key: str, jobs: Sequence[int]) -> None:
        """The load of the jobs on a simulated device (see :func:`sim_load`)."""
        if self._sim is None:
            return
        if not jobs:
            self._sim.clear_load(key)
            return
        total = next(
            (d.static.mem_total_bytes for d in self.report.devices if d.static.key == key), None
        )
        self._sim.set_load(key, *sim_load(jobs, total or 0))


WHOLE_UTIL_PCT = 90.0
"""What a job given a whole simulated device keeps it busy at."""
USED_FRACTION = 0.5
"""The part of its memory (the device's, or its share's) a simulated job uses."""


def sim_load(jobs: Sequence[int], total_bytes: int) -> tuple[float, int]:
    """Utilization and memory in use of a device running ``jobs`` (each the bytes of a share it
    holds, 0 for a job given the whole device): a whole job as before, 90% and half the memory;
    shares add up, each busy in proportion to its part of the memory and using half its share."""
    if 0 in jobs or total_bytes <= 0:
        return WHOLE_UTIL_PCT, int(total_bytes * USED_FRACTION)
    held = min(sum(jobs), total_bytes)
    return WHOLE_UTIL_PCT * held / total_bytes, int(held * USED_FRACTION)
