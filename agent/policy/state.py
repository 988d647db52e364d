"""What a decider keeps between passes so a pass costs little: the capacity index and the running
jobs grouped by node and by what they run on. Both are rebuilt incrementally from each snapshot
(unchanged snapshot parts are the same objects); neither holds anything a snapshot does not."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.policy.index import ClusterIndex
from agent.policy.snapshot import Running

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

    def refresh(self, running: Iterable[Running]) -> None:
        seen: set[str] = set()
        for r in running:
            job_id = r.job.job_id
            seen.add(job_id)
            held = self.jobs.get(job_id)
            if held is r:
                continue
            if held is not None:
                self._remove(held)
            self._add(r)
        if len(seen) != len(self.jobs):
            for job_id in [k for k in self.jobs if k not in seen]:
                self._remove(self.jobs[job_id])

    def _add(self, r: Running) -> None:
        job_id = r.job.job_id
        self.jobs[job_id] = r
        for node_id in r.placement.node_ids:
            self.by_node.setdefault(node_id, {})[job_id] = r
        if not r.job.is_gang and not r.job.is_share and r.job.gpus_per_node > 0:
            self.groups.setdefault(run_key(r), {})[job_id] = r

    def _remove(self, r: Running) -> None:
        job_id = r.job.job_id
        del self.jobs[job_id]
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
    """Keep one per decider and pass it to every :func:`agent.policy.decide.decide`."""

    index: ClusterIndex = field(default_factory=ClusterIndex)
    running: RunningIndex = field(default_factory=RunningIndex)
    never: dict[tuple[object, ...], tuple[int, str | None]] = field(default_factory=dict)
    """Why a requirement can never fit, by requirement, at an index static version."""
