"""What the simulated mesh is made of: its configuration, nodes, devices and jobs, and what a
policy answers it (:class:`Plan`: starts, preemptions, moves). :mod:`bench.sched.engine` runs it."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from agent.policy.fragmentation import Shape
from agent.policy.snapshot import Device, Job, Node, Placement, Running, Share, Snapshot
from agent.policy.teams import TeamQuota
from bench.sched.cluster import NodeSpec
from bench.sched.traces import TraceJob
from bench.sched.truth import Truth

if TYPE_CHECKING:
    from bench.sched.engine import Simulation


@dataclass(frozen=True, slots=True)
class Start:
    job_id: str
    placements: tuple[Placement, ...]
    """The best first, then the alternates tried in turn if a node declines."""
    after: tuple[str, ...] = ()
    """Jobs that stop first (the start waits ``grace_s`` for them)."""


@dataclass(frozen=True, slots=True)
class MoveOrder:
    job_id: str
    placement: Placement
    after: tuple[str, ...] = ()
    """Jobs stopping first whose devices it takes: it stops now and restarts there once they
    have (``grace_s``)."""


@dataclass(frozen=True, slots=True)
class Plan:
    starts: tuple[Start, ...] = ()
    moves: tuple[MoveOrder, ...] = ()
    stops: tuple[str, ...] = ()
    """Preemption victims."""
    assigned_ms: float = 0.0


class MeshPolicy(Protocol):
    name: str

    def plan(self, snapshot: Snapshot, sim: Simulation) -> Plan: ...


@dataclass(frozen=True, slots=True)
class SimConfig:
    owners: int = 16
    gossip_delay_s: float = 2.0
    view_lag_s: float = 0.0
    """Half of the owners (odd-numbered) decide from a view this much older still: the nodes
    and running jobs they see are those of a pass at least this long ago (their gossip lags
    more), so owners whose views differ decide at once."""
    report_s: float = 60.0
    checkpoint_s: float = 1800.0
    grace_s: float = 30.0
    move_cost_s: float = 60.0
    """A job run again after a preemption or a move makes no progress for this long."""
    retry_s: float = 1.0
    review_s: float = 600.0
    """While jobs run, owners look again at least this often (moves need no event)."""
    quota_desk: bool = False
    """Model the team's quota desk (``agent/running/teamdesk.py``): a start that would take its
    team past a maximum, counting what runs, is refused; the policy places the job again."""
    fill: bool = False
    shapes: tuple[Shape, ...] = ()
    """The workload's task shapes the policy is told (``--workload list``: an openb pod list's,
    FGD's setting); empty: those of the jobs arrived so far."""
    quotas: tuple[TeamQuota, ...] = ()
    """Team quotas (``--teams``): the policy is told them and the run reports the teams' figures
    (:mod:`bench.sched.teamstats`)."""


@dataclass(slots=True)
class SimDevice:
    key: str
    model: str
    mem_bytes: int
    whole: str | None = None
    shares: dict[str, tuple[int, str]] = field(default_factory=dict)

    def share_free(self) -> int:
        if self.whole is not None:
            return 0
        return self.mem_bytes - sum(b for b, _ in self.shares.values())


@dataclass(slots=True)
class SimNode:
    spec: NodeSpec
    devices: dict[str, SimDevice]
    cpu_used: int = 0
    mem_used: int = 0

    def to_policy(self) -> Node:
        s = self.spec
        return Node(
            node_id=s.node_id,
            devices=tuple(
                Device(
                    key=d.key,
                    model=d.model,
                    mem_total_bytes=d.mem_bytes,
                    whole_job=d.whole,
                    shares=tuple(Share(j, b, c) for j, (b, c) in d.shares.items()),
                    link_domain="0",
                    link_kind="nvlink",
                )
                for d in self.devices.values()
            ),
            zone=s.zone,
            cpu_milli_total=s.cpu_milli,
            cpu_milli_used=self.cpu_used,
            host_mem_total_bytes=s.host_mem_bytes,
            host_mem_used_bytes=self.mem_used,
        )


@dataclass(slots=True)
class SimJob:
    trace: TraceJob
    job: Job
    owner: str
    state: str = "pending"
    placement: Placement | None = None
    model: str = ""
    rate: float = 0.0
    """Steps per second now."""
    seg_start: float = 0.0
    """When the current run segment started making progress."""
    done: float = 0.0
    """Steps done at ``seg_start``."""
    attempt_start: float = 0.0
    first_start: float | None = None
    finish_at: float | None = None
    version: int = 0
    moved_at: float | None = None
    reported: bool = False
    ref_s: float = 0.0
    """Reference seconds of work done in earlier segments (what the model learns from)."""
    running: Running | None = None
    in_flight: bool = False
    """Not placed now: it is stopping, or its start waits for other jobs to stop (``held``)."""
    held: bool = False

    def steps_at(self, t: float) -> float:
        if t <= self.seg_start:
            return self.done
        return self.done + self.rate * (t - self.seg_start)

    def checkpoint_at(self, t: float, every_s: float) -> tuple[float, float]:
        """(time, steps) of the last checkpoint before ``t`` in this segment."""
        if t <= self.seg_start:
            return self.seg_start, self.done
        k = math.floor((t - self.seg_start) / every_s)
        at = self.seg_start + k * every_s
        return at, self.steps_at(at)


def owner_of(job_id: str, owners: Sequence[str]) -> str:
    """Rendezvous hashing: the owner that ranks first for this job."""
    return max(owners, key=lambda o: zlib.crc32(f"{o}/{job_id}".encode()))


def policy_job(job_id: str, tj: TraceJob, owner: str) -> Job:
    return Job(
        job_id=job_id,
        job_class=tj.job_class,
        kind=tj.kind,  # type: ignore[arg-type]
        owner=owner,
        gpus_per_node=tj.gpus,
        nodes=tj.nodes,
        share_fraction=tj.fraction,
        models=tj.models,
        priority=tj.priority,
        preemptible=tj.preemptible,
        deadline=tj.deadline_s,
        submitted_at=tj.arrival_s,
        cpu_milli=tj.cpu_milli,
        host_mem_bytes=tj.host_mem_bytes,
        team=tj.team,
        user=tj.user,
    )


def true_rate(truth: Truth, sj: SimJob, node: SimNode, placement: Placement) -> tuple[float, str]:
    """How fast ``sj`` truly runs on ``placement`` (its first node ``node``), and that node's
    GPU model: Gavel's throughputs, slowed by the jobs sharing its GPU."""
    tj = sj.trace
    first = node.devices[placement.devices[0][0]] if placement.devices[0] else None
    model = first.model if first is not None else "cpu"
    if math.isinf(tj.work):
        return 0.0, model
    gpus = max(tj.gpus * tj.nodes, 1)
    rate = truth.rate(tj.job_class, model, gpus, len(placement.node_ids) == 1)
    if placement.share_mem_bytes and first is not None:
        others = [c for j, (_b, c) in first.shares.items() if j != sj.job.job_id]
        rate *= truth.share_factor(tj.job_class, others, model)
    return rate, model
