"""The simulator's decisions on seeded traces, as digests: a change that only makes the policy or
the simulator faster must leave every start, preemption and move where and when it was.

A change that alters decisions on purpose updates the digests here, and says so in its commit.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from agent.policy.config import PolicyConfig
from agent.policy.snapshot import Placement
from bench.sched.cluster import NodeSpec, nodes_from_openb, nodes_from_spec
from bench.sched.engine import Simulation
from bench.sched.policies import BackfillCentral, BestFitCentral, FifoMesh, ShoalMesh
from bench.sched.simtypes import MoveOrder, SimConfig, SimJob
from bench.sched.traces import TraceJob, gavel_synthetic, openb
from bench.sched.truth import Truth

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class _Recording(Simulation):
    """The simulation, writing down every start, stop and move as it happens."""

    log: list[str]

    def _start(self, sj: SimJob, placement: Placement, *, resume_at: float | None = None) -> None:
        self.log.append(f"start {self.now:.6f} {sj.job.job_id} {placement}")
        super()._start(sj, placement, resume_at=resume_at)

    def _stop(self, job_id: str, *, preempted: bool) -> None:
        self.log.append(f"stop {self.now:.6f} {job_id} {preempted}")
        super()._stop(job_id, preempted=preempted)

    def _move(self, move: MoveOrder) -> None:
        self.log.append(f"move {self.now:.6f} {move.job_id} {move.placement}")
        super()._move(move)


def _policy(name: str) -> object:
    table = {
        "shoal": lambda: ShoalMesh(PolicyConfig()),
        "fifo": FifoMesh,
        "backfill": BackfillCentral,
        "bestfit": BestFitCentral,
    }
    return table[name]()


def _digest(
    name: str, nodes: list[NodeSpec], jobs: list[TraceJob], config: SimConfig
) -> tuple[str, int]:
    policy = _policy(name)
    if getattr(policy, "central", False):
        config = dataclasses.replace(config, gossip_delay_s=0.0, owners=1)
    sim = _Recording(nodes, jobs, policy, Truth(), config)  # type: ignore[arg-type]
    sim.log = []
    sim.run()
    return hashlib.sha256("\n".join(sim.log).encode()).hexdigest()[:16], len(sim.log)


def _openb_fleet() -> list[NodeSpec]:
    """The fixture's 24 nodes, eight times over (ids apart, CPU a little apart): enough nodes in
    distinct states that the policy's groups and caches matter."""
    base = nodes_from_openb(FIXTURES / "openb" / "openb_node_list_gpu_node.csv")
    out = []
    for k in range(8):
        for spec in base:
            cpu = None if spec.cpu_milli is None else spec.cpu_milli - 1000 * k
            out.append(dataclasses.replace(spec, node_id=f"{spec.node_id}-{k}", cpu_milli=cpu))
    return out


SYNTHETIC = {
    "backfill": ("53233a1f6dfe01a3", 80),
    "fifo": ("3937b9f403221bb4", 80),
    "shoal": ("f256b9c2f7e61ee9", 331),
}
OPENB = {
    "bestfit": ("4864c0054aebb236", 801),
    "fifo": ("8ff15012f655900a", 842),
    "shoal": ("c6f0d7e7d2855c3a", 849),
}


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_decisions_on_gavels_synthetic_trace_are_unchanged(name: str) -> None:
    nodes = nodes_from_spec("v100:16,p100:16,k80:16", 8)
    jobs = gavel_synthetic(80, 8.0, 2, multi_gpu=True, gpus_per_node=8, priorities=False)
    assert _digest(name, nodes, jobs, SimConfig()) == SYNTHETIC[name]


@pytest.mark.parametrize("name", sorted(OPENB))
def test_decisions_on_an_openb_fill_are_unchanged(name: str) -> None:
    nodes = _openb_fleet()
    total = sum(n.gpus for n in nodes)
    jobs = openb(
        FIXTURES / "openb" / "openb_pod_list_default.csv",
        1,
        fill=1.3,
        capacity_gpus=total,
        interval_s=0.25,
    )
    assert _digest(name, nodes, jobs, SimConfig(fill=True)) == OPENB[name]


class _Watching(Simulation):
    """Writes down, at each review, when each running job's record says it last checkpointed."""

    seen: list[tuple[float, float | None]]

    def _review(self, payload: object) -> None:
        self.seen.extend((self.now, r.last_checkpoint_at) for r in self.running.values())
        super()._review(payload)


def test_running_jobs_records_say_when_they_last_checkpointed() -> None:
    """Preemption picks the victims that lose least since their last checkpoint: the simulated
    records must say when that was, as the live node records do, not when the job started."""
    nodes = nodes_from_spec("v100:8", 8)
    (job,) = gavel_synthetic(1, 1.0, 1, multi_gpu=False, gpus_per_node=8)
    config = SimConfig(checkpoint_s=1000.0, review_s=600.0)
    job = dataclasses.replace(
        job, arrival_s=0.0, work=Truth().rate(job.job_class, "v100", 1) * 4500
    )
    sim = _Watching(nodes, [job], ShoalMesh(PolicyConfig()), Truth(), config)
    sim.seen = []
    sim.run()
    late = [(t, saved) for t, saved in sim.seen if t > 1100.0]
    assert late, sim.seen
    for t, saved in late:
        assert saved is not None and t - 1000.0 <= saved <= t, (t, saved)
