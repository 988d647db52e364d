"""This host's devices as the agent holds them: the probe, its latest report, the simulated load.

``HostDevices`` opens the probe once, refreshes it on demand (in a thread for real hardware, at
once for the simulated prober, which only computes), and answers the runner's
``LocalDevices`` seam: the accelerators a job may be given, and the load a job puts on a
simulated device (so the demo's telemetry shows busy GPUs).
"""

from __future__ import annotations

import asyncio
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

    def set_load(self, key: str, on: bool) -> None:
        if self._sim is None:
            return
        if on:
            total = next(
                (d.static.mem_total_bytes for d in self.report.devices if d.static.key == key),
                None,
            )
            self._sim.set_load(key, 90.0, int((total or 0) * 0.5))
        else:
            self._sim.clear_load(key)
