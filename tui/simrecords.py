"""The records the simulated mesh (:mod:`tui.simmesh`) keeps of its hosts and jobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.job.jobspec import JobSpec
from probers.records import DeviceStatic, HostInfo
from probers.sim import SimProber


@dataclass
class SimHost:
    index: int
    node_id: str
    hostname: str
    addr: str
    prober: SimProber
    statics: list[DeviceStatic]
    host: HostInfo
    zone: str
    state: str = "alive"
    drain: str = "schedulable"
    drain_deadline: float | None = None
    age_s: float = 1.0
    frozen: list[dict[str, Any]] | None = None
    static_json: list[dict[str, Any]] | None = None
    """The last devices seen, kept for a host that stopped reporting."""
    frozen_at: float | None = None
    """The clock reading ``frozen`` was sampled at: a second read at the same moment reuses it."""


@dataclass
class SimJob:
    job_id: str
    spec: JobSpec
    owner: str
    submitted_at: float
    user: str
    state: str = "pending"
    attempt: int = 1
    runner: str | None = None
    devices: list[str] = field(default_factory=list)
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    duration_s: float = 3600.0
    done_before_s: float = 0.0
    """Seconds of work done in earlier placements (kept across a migration)."""

    def live_on(self, node_id: str) -> bool:
        return self.runner == node_id and self.state in ("running", "migrating", "placing")
