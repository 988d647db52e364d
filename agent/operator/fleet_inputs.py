"""The fleet history's inputs from what the agents answer (sans I/O): each node's ``GET
/v1/history`` as GPU tracks, ``GET /v1/usage`` rows as held GPUs, ``GET /v1/jobs`` records as
waits, and ``GET /v1/nodes`` for each GPU's vendor and model (:mod:`agent.operator.fleet_history`
counts them).

Which GPU models a waiting job could have used is the scheduling policy's answer: its own device
filters (:func:`agent.policy.filters.device_reason`) on every GPU the mesh lists, taken healthy
(a GPU unhealthy now may not have been then).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agent.job.jobspec import JobSpec
from agent.operator.fit import decode_node
from agent.operator.fleet_history import GpuTrack, Grid, Held, Wait
from agent.policy.adapt import device_from_static, job_from_spec
from agent.policy.filters import device_reason
from agent.wire.codec import WireError
from agent.wire.documents import JobDoc
from agent.wire.history import HistoryDoc
from agent.wire.usage import UsageRow
from probers.records import DeviceStatic

UTIL_SERIES: Final = "gpu.util_pct"
WAITING_STATES: Final = ("pending", "placing")
UNKNOWN: Final = "unknown"
"""Vendor and model of a GPU the history has and the mesh no longer lists."""


def model_name(static: DeviceStatic) -> str:
    """A GPU's model as the usage rows name it (a simulated device's without its suffix)."""
    return static.name.removesuffix(" (simulated)")


@dataclass(frozen=True, slots=True)
class FleetGpus:
    """Every GPU the mesh lists: ``(node, device key)`` -> its facts."""

    statics: Mapping[tuple[str, str], DeviceStatic]

    @classmethod
    def from_nodes(cls, nodes: Iterable[Mapping[str, Any]]) -> FleetGpus:
        out: dict[tuple[str, str], DeviceStatic] = {}
        for raw in nodes:
            decoded = decode_node(raw)
            if decoded is None:
                continue
            doc, devices = decoded
            for d in devices:
                if d.static.backend != "cpu":
                    out[(doc.node_id, d.static.key)] = d.static
        return cls(out)


def tracks(grid: Grid, doc: HistoryDoc, gpus: FleetGpus) -> list[GpuTrack]:
    """The ``gpu.util_pct`` series of one node's answer on ``grid`` (a step's points averaged;
    points outside the grid left out)."""
    out = []
    for s in doc.series:
        if s.name != UTIL_SERIES or s.unsupported is not None:
            continue
        sums = [0.0] * grid.steps
        ns = [0] * grid.steps
        for t, _, avg, _ in s.points:
            i = (t - grid.from_s) // grid.step_s
            if avg is not None and 0 <= i < grid.steps:
                sums[i] += avg
                ns[i] += 1
        static = gpus.statics.get((doc.node, s.subject))
        out.append(
            GpuTrack(
                node=doc.node,
                device=s.subject,
                vendor=UNKNOWN if static is None else static.vendor,
                model=UNKNOWN if static is None else model_name(static),
                util_pct=tuple(v / n if n else None for v, n in zip(sums, ns, strict=True)),
            )
        )
    return out


def held(rows: Iterable[UsageRow]) -> list[Held]:
    """GPUs held by attempts, deduplicated on ``(job, attempt, node)`` (CPU-only rows left
    out)."""
    seen: dict[tuple[str, int, str], Held] = {}
    for r in rows:
        if r.model != "cpu" and r.gpus > 0:
            seen[(r.job_id, r.attempt, r.node)] = Held(
                r.node, r.model.removesuffix(" (simulated)"), r.gpus, r.started_at, r.finished_at
            )
    return list(seen.values())


def wait_spans(doc: JobDoc) -> list[tuple[float, float | None]]:
    """When the job waited: from its submission to its first attempt's start, from each
    attempt's end to the next one's start, and, while it waits now, from the last end on."""
    s = doc.status
    if s.submitted_at is None:
        return []
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    for a in s.attempts:
        if a.started_at is not None:
            starts[a.attempt] = min(starts.get(a.attempt, a.started_at), a.started_at)
        if a.finished_at is not None:
            ends[a.attempt] = max(ends.get(a.attempt, a.finished_at), a.finished_at)
    if not starts and s.started_at is not None:
        starts[s.attempt] = s.started_at
    waiting = s.state in WAITING_STATES
    out: list[tuple[float, float | None]] = []
    since: float | None = s.submitted_at
    for n in sorted(starts):
        if since is not None and starts[n] > since:
            out.append((since, starts[n]))
        since = ends.get(n)
    if since is not None and (waiting or not starts):
        end = None if waiting else s.finished_at
        if end is None or end > since:
            out.append((since, end))
    return out


def models_for(spec: JobSpec, gpus: FleetGpus) -> frozenset[str]:
    """The GPU models of the mesh that the job's per-GPU constraints accept."""
    job = job_from_spec("", spec)
    out = set()
    for static in gpus.statics.values():
        if device_reason(job, device_from_static(static, None, None)) is None:
            out.add(model_name(static))
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class Waits:
    waits: tuple[Wait, ...]
    unreadable: int
    """Job records that did not decode (counted, and left out)."""


def waits(jobs: Sequence[Mapping[str, Any]], gpus: FleetGpus) -> Waits:
    """Every GPU job's waits, each with the models it could have run on."""
    out: list[Wait] = []
    bad = 0
    accepted: dict[str, frozenset[str]] = {}
    for raw in jobs:
        try:
            doc = JobDoc.from_wire(raw)
            spec = JobSpec.from_dict(doc.spec)
        except (WireError, ValueError, TypeError, KeyError):
            bad += 1
            continue
        r = spec.resources
        if r.gpus_per_node <= 0:
            continue
        spans = wait_spans(doc)
        if not spans:
            continue
        key = repr(r)
        if key not in accepted:
            accepted[key] = models_for(spec, gpus)
        for start, end in spans:
            out.append(Wait(doc.job_id, r.gpus_per_node, r.nodes, accepted[key], start, end))
    return Waits(tuple(out), bad)
