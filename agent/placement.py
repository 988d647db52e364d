"""Where a job may run: the ``Placement`` seam and its first implementation, first fit.

The owner asks a ``Placement`` for an ordered list of candidates (node and device keys) from its
gossip view; it then offers the job to each in turn, and the node admits or declines against its
real local state. :class:`FirstFit` applies the hard filters only (the job-spec features the
node's agent runs, drain state, accepted backend, free GPU count, memory per GPU, compute
capability, architecture) and orders nodes by id, a
preferred target first; the scheduler replaces it with a scoring policy behind the same seam.
When no node fits, :meth:`Placement.why_pending` says what the job waits for, in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from agent.jobspec import JobSpec, lacking_reason
from agent.jobstate import NodeDrainState
from agent.view import NodeView
from probers.records import DeviceStatic


@dataclass(frozen=True, slots=True)
class Candidate:
    node_id: str
    devices: tuple[str, ...]
    """Device keys offered to the job on that node (empty for a CPU-only job)."""


class Placement(Protocol):
    def candidates(
        self,
        spec: JobSpec,
        nodes: Sequence[NodeView],
        *,
        exclude: frozenset[str] = frozenset(),
        prefer: str | None = None,
    ) -> list[Candidate]:
        """Nodes that pass the hard filters, best first (``nodes`` are live agents)."""
        ...

    def why_pending(self, spec: JobSpec) -> str:
        """One line saying what the job waits for."""
        ...


def _cc_tuple(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        return None


class DeviceFacts(Protocol):
    """What the per-GPU filters read: a :class:`DeviceStatic`, or the TUI's view of one."""

    @property
    def vendor(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def mem_total_bytes(self) -> int | None: ...
    @property
    def compute_capability(self) -> str | None: ...
    @property
    def arch(self) -> str | None: ...


def device_fits(spec: JobSpec, d: DeviceFacts) -> bool:
    """Whether one device meets the job's per-GPU constraints (the agents and the TUI's preview)."""
    r = spec.resources
    if r.backends and d.backend not in r.backends:
        return False
    if r.min_mem_per_gpu_bytes is not None and (
        d.mem_total_bytes is None or d.mem_total_bytes < r.min_mem_per_gpu_bytes
    ):
        return False
    if r.min_compute_capability is not None:
        want, have = _cc_tuple(r.min_compute_capability), _cc_tuple(d.compute_capability)
        if d.vendor != "nvidia" or want is None or have is None or have < want:
            return False
    return not (r.archs and (d.arch or "").lower() not in {a.lower() for a in r.archs})


def pick_devices(spec: JobSpec, statics: Sequence[DeviceStatic], free: Sequence[str]) -> list[str]:
    """The first free devices that fit, all of one vendor; fewer than asked when none fit."""
    want = spec.resources.gpus_per_node
    if want == 0:
        return []
    free_set = set(free)
    by_vendor: dict[str, list[str]] = {}
    for d in statics:
        if d.key in free_set and d.backend != "cpu" and device_fits(spec, d):
            by_vendor.setdefault(d.vendor, []).append(d.key)
    best: list[str] = []
    for keys in by_vendor.values():
        if len(keys) >= want:
            return keys[:want]
        if len(keys) > len(best):
            best = keys
    return best


class FirstFit:
    """Hard constraints only; nodes in id order, ``prefer`` first."""

    def candidates(
        self,
        spec: JobSpec,
        nodes: Sequence[NodeView],
        *,
        exclude: frozenset[str] = frozenset(),
        prefer: str | None = None,
    ) -> list[Candidate]:
        out: list[Candidate] = []
        want = spec.resources.gpus_per_node
        features = frozenset(spec.features)
        for node in sorted(nodes, key=lambda n: (n.node_id != prefer, n.node_id)):
            if node.node_id in exclude or node.inventory is None:
                continue
            if not features <= node.features:
                continue
            if node.drain != NodeDrainState.SCHEDULABLE:
                continue
            keys = pick_devices(spec, node.statics, node.free)
            if len(keys) < want:
                continue
            out.append(Candidate(node.node_id, tuple(keys)))
        return out

    def why_pending(self, spec: JobSpec) -> str:
        r = spec.resources
        if spec.features:
            return "waits for an agent that runs it: " + lacking_reason(spec.features)
        parts = [
            f"no schedulable node has {r.gpus_per_node} free GPU" + "s" * (r.gpus_per_node != 1)
        ]
        if r.min_mem_per_gpu_bytes is not None:
            parts.append(f"with >= {r.min_mem_per_gpu_bytes / 1024**3:g} GiB")
        if r.backends:
            parts.append(f"and backend {'/'.join(r.backends)}")
        if r.min_compute_capability is not None:
            parts.append(f"and compute capability >= {r.min_compute_capability}")
        if r.archs:
            parts.append(f"and arch {'/'.join(r.archs)}")
        return " ".join(parts)
