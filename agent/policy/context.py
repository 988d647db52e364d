"""One decision pass's working state: the snapshot, the index, the model and their caches."""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, field, replace

from agent.policy.config import PolicyConfig
from agent.policy.fragmentation import FragKey, Shape, normalize
from agent.policy.index import ClusterIndex, DeviceKind
from agent.policy.model import ThroughputModel
from agent.policy.snapshot import Job, Running, Snapshot

ReqKey = int
"""A job's requirements (:func:`req_key`) interned as a small number: cheap to hash."""


StaticFits = dict[tuple[str, str], tuple[int, Job, frozenset[str] | None]]
"""By job id and node id: at an index static version, the node's devices that pass the job's
device filters, or ``None`` when the node can never host it."""


def req_key(job: Job) -> tuple[object, ...]:
    """Everything about a job that decides where it fits and what a device is worth to it."""
    return (
        job.job_class,
        job.kind,
        job.gpus_per_node,
        job.gpus_max_per_node,
        job.share_mem_bytes,
        job.share_fraction,
        job.min_mem_per_gpu_bytes,
        job.backends,
        job.min_compute_capability,
        job.archs,
        job.models,
        job.interconnect,
        job.cpu_milli,
        job.host_mem_bytes,
    )


def shape_of(job: Job, models: bool = True) -> Shape:
    """The job's shape; ``models``: with the GPU models it accepts (in one order), else any."""
    named = tuple(sorted(job.models)) if models else ()
    if job.is_share:
        fraction = job.share_fraction if job.share_fraction is not None else 0.5
        return Shape(1, min(fraction, 0.999), job.cpu_milli, models=named)
    return Shape(job.gpus_per_node, 1.0, job.cpu_milli, models=named)


def workload_shapes(snapshot: Snapshot, models: bool = True) -> tuple[Shape, ...]:
    """The shapes fragmentation is measured against: the snapshot's, else the jobs in it.
    ``models``: the shapes keep the GPU models they accept (read under ``packing`` only; else
    shapes that differ only in their models are one)."""
    if snapshot.shapes:
        return normalize(
            snapshot.shapes if models else [replace(s, models=()) for s in snapshot.shapes]
        )
    counts: Counter[Shape] = Counter()
    for job in snapshot.pending:
        counts[shape_of(job, models)] += 1
    for r in snapshot.running:
        counts[shape_of(r.job, models)] += 1
    if not counts:
        return normalize([Shape(1)])
    return normalize(
        [Shape(s.gpus, s.fraction, s.cpu_milli, n, s.models) for s, n in counts.items()]
    )


def spread_hash(owner: str | None, node_id: str) -> float:
    """A number in [0, 1) that differs between owners for one node, stable across runs."""
    return (zlib.crc32(f"{owner or ''}/{node_id}".encode()) & 0xFFFF) / 65536.0


@dataclass(slots=True)
class Context:
    snapshot: Snapshot
    index: ClusterIndex
    model: ThroughputModel
    config: PolicyConfig
    owner: str | None = None
    shapes: tuple[Shape, ...] = ()
    frag_cache: dict[FragKey, float] = field(default_factory=dict)
    frag_models: bool = False
    """Some of ``shapes`` accept only some GPU models: fragmentation reads the GPUs' models."""
    frag_vectors: dict[FragKey, tuple[float, ...]] | None = None
    """Per-shape fragmentation by node state for these shapes' sizes (kept across passes by
    the state; see :class:`agent.policy.fragmentation.FragVectors`)."""
    group_cache: dict[tuple[ReqKey, int, int], object] = field(default_factory=dict)
    kind_ok: dict[tuple[ReqKey, DeviceKind], str | None] = field(default_factory=dict)
    """Why a kind of device cannot serve a requirement (kept across passes by the state)."""
    req_keys: dict[str, tuple[Job, ReqKey]] = field(default_factory=dict)
    """Each job's interned requirements, by job id (kept across passes by the state)."""
    interned: dict[tuple[object, ...], ReqKey] = field(default_factory=dict)
    work_cache: dict[str, tuple[float, float]] = field(default_factory=dict)
    eligible: dict[tuple[int, bool, int], dict[str, list[Running]]] = field(default_factory=dict)
    """The running jobs a pending job may preempt, by node, by what decides it of the pending
    job (priority, preemptible, service level): :func:`agent.policy.preempt.may_preempt`."""
    levels: dict[str, int] = field(default_factory=dict)
    """Each running job's service level at this pass's ``now``, by job id (time slicing)."""
    static_fits: StaticFits = field(default_factory=dict)
    """Whether a node can ever host a job (``static_fit``) and which of its devices pass the
    job's device filters, by job id and node id, at an index static version (kept across passes
    by the state: what they read of a node changes only with that version)."""

    def key(self, job: Job) -> ReqKey:
        """``req_key(job)`` interned, memoized by job id (a job's requirements never change)."""
        held = self.req_keys.get(job.job_id)
        if held is not None and held[0] is job:
            return held[1]
        full = req_key(job)
        key = self.interned.get(full)
        if key is None:
            key = self.interned[full] = len(self.interned)
        if len(self.req_keys) > 100_000:
            self.req_keys.clear()
        self.req_keys[job.job_id] = (job, key)
        return key

    def work_ref_s(self, job: Job) -> tuple[float, float]:
        """p50/p90 of the job's work in reference seconds (its class's, as the model knows it)."""
        held = self.work_cache.get(job.job_class)
        if held is None:
            held = self.work_cache[job.job_class] = self.model.work_ref_s(job.job_class)
        return held

    def duration_s(self, job: Job, speed: float) -> tuple[float, float]:
        """p50/p90 of how long the job runs at ``speed`` (reference seconds per second), never
        past its runtime limit."""
        p50, p90 = self.work_ref_s(job)
        speed = max(speed, 1e-6)
        d50, d90 = p50 / speed, p90 / speed
        if job.max_runtime_s is not None:
            return min(d50, job.max_runtime_s), min(d90, job.max_runtime_s)
        return d50, d90
