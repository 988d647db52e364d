"""What a decider keeps between passes so a pass costs little: the capacity index and the running
jobs grouped by node and by what they run on. Both are rebuilt incrementally from each snapshot
(unchanged snapshot parts are the same objects); neither holds anything a snapshot does not."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.policy.context import ReqKey, StaticFits
from agent.policy.fragmentation import FragVectors
from agent.policy.index import ClusterIndex, DeviceKind
from agent.policy.snapshot import Job, Placement, Running

RunKey = tuple[str, str, int, str]
"""A running job's class, kind, GPUs per node and device model."""


def run_key(r: Running) -> RunKey:
    return (r.job.job_class, r.job.kind, r.job.gpus_per_node, r.device_model)


class RunningIndex:
    """Running jobs by id, by node, and (single-node, whole-GPU ones) by :data:`RunKey`."""

    def __init__(self) -> None:
        self.jobs: dict[str, Running] = {}
        self.by_node: dict[str, dict[str, Running]] = {}
        self.groups: dict[RunKey, dict[str, Running]] = {}
        self._source: Sequence[Running] | None = None
        self._by_id: dict[int, Running] = {}
        self.preemptible: Counter[int] = Counter()
        """Running preemptible jobs by priority (a job of a priority no higher than all of
        them has nothing to preempt)."""

    def refresh(self, running: Sequence[Running]) -> None:
        """Hold exactly ``running``: only objects not held before are indexed (by identity)."""
        if running is self._source:
            return
        self._source = running
        by_id = dict(zip(map(id, running), running, strict=True))
        held = self._by_id
        for k in held.keys() - by_id.keys():
            r = held[k]
            if self.jobs.get(r.job.job_id) is r:
                self._remove(r)
        for k in by_id.keys() - held.keys():
            r = by_id[k]
            old = self.jobs.get(r.job.job_id)
            if old is not None:
                self._remove(old)
            self._add(r)
        self._by_id = by_id

    def _add(self, r: Running) -> None:
        job_id = r.job.job_id
        self.jobs[job_id] = r
        if r.job.preemptible:
            self.preemptible[r.job.priority] += 1
        for node_id in r.placement.node_ids:
            self.by_node.setdefault(node_id, {})[job_id] = r
        if not r.job.is_gang and not r.job.is_share and r.job.gpus_per_node > 0:
            self.groups.setdefault(run_key(r), {})[job_id] = r

    def _remove(self, r: Running) -> None:
        job_id = r.job.job_id
        del self.jobs[job_id]
        if r.job.preemptible:
            self.preemptible[r.job.priority] -= 1
            if not self.preemptible[r.job.priority]:
                del self.preemptible[r.job.priority]
        for node_id in r.placement.node_ids:
            on_node = self.by_node.get(node_id)
            if on_node is not None:
                on_node.pop(job_id, None)
                if not on_node:
                    del self.by_node[node_id]
        group = self.groups.get(run_key(r))
        if group is not None:
            group.pop(job_id, None)
            if not group:
                del self.groups[run_key(r)]


@dataclass
class PolicyState:
    """Keep one per decider and pass it to every :func:`agent.policy.decision.decide`."""

    index: ClusterIndex = field(default_factory=ClusterIndex)
    running: RunningIndex = field(default_factory=RunningIndex)
    never: dict[tuple[object, ...], tuple[int, str | None]] = field(default_factory=dict)
    """Why a requirement can never fit, by requirement, at an index static version."""
    never_by_job: dict[str, tuple[int, Job, str | None]] = field(default_factory=dict)
    """The same by job id (a job's requirements never change)."""
    kind_ok: dict[tuple[ReqKey, DeviceKind], str | None] = field(default_factory=dict)
    req_keys: dict[str, tuple[Job, ReqKey]] = field(default_factory=dict)
    interned: dict[tuple[object, ...], ReqKey] = field(default_factory=dict)
    move_potential: dict[tuple[object, ...], tuple[float, float]] = field(default_factory=dict)
    """A running group's speed and the best it could move to, by group and idle device kinds."""
    static_fits: StaticFits = field(default_factory=dict)
    """Whether a job can ever go to a node, and on which devices (see :data:`StaticFits`)."""
    frag_vectors: FragVectors = field(default_factory=FragVectors)
    """Per-shape fragmentation of the node states seen, while the shapes keep their sizes."""
    defrag: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Nodes being emptied for a waiting job: job id -> (node id, held until)."""
    promised: dict[str, tuple[Placement, float, float]] = field(default_factory=dict)
    """Starts and moves that wait for jobs to stop (preemption, reclaim): job id -> (its new
    devices, when decided, held until). Until it runs there (or starts anew elsewhere), no other
    job takes the ones of them that are idle, so it does not find them gone when it starts."""
    passes: int = 0
