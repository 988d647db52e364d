"""The simulated mesh carries out what the guarantee plan asks: a move onto GPUs of a job that is
stopping waits for it, and a job restarted after a preemption is guarded from the time it
restarted, not from a move of an earlier attempt."""

from __future__ import annotations

from dataclasses import replace

from agent.policy.snapshot import Placement, Snapshot
from bench.sched.cluster import NodeSpec
from bench.sched.engine import Simulation
from bench.sched.simtypes import MoveOrder, Plan, SimConfig, SimJob, Start
from bench.sched.traces import TraceJob, gavel_synthetic
from bench.sched.truth import Truth

GIB = 1024**3
NODES = [NodeSpec("n1", "v100", 1, 32 * GIB), NodeSpec("n2", "v100", 1, 32 * GIB)]
ON_N1 = Placement(("n1",), (("n1/0",),))
ON_N2 = Placement(("n2",), (("n2/0",),))


class _Script:
    """Starts x on n1 and v on n2; at its first look from 1,000 s on, stops v and moves x onto
    v's GPU once v has stopped."""

    name = "script"
    central = False

    def __init__(self) -> None:
        self.step = 0

    def plan(self, snapshot: Snapshot, sim: Simulation) -> Plan:
        if self.step == 0 and len(snapshot.pending) >= 2:
            self.step = 1
            return Plan(starts=(Start("j000000", (ON_N1,)), Start("j000001", (ON_N2,))))
        if self.step == 1 and sim.now >= 1000.0 and len(snapshot.running) == 2:
            self.step = 2
            move = MoveOrder("j000000", ON_N2, after=("j000001",))
            return Plan(moves=(move,), stops=("j000001",))
        return Plan()


class _Recording(Simulation):
    log: list[tuple[float, str, str]]

    def _start(self, sj: SimJob, placement: Placement, *, resume_at: float | None = None) -> None:
        self.log.append((self.now, sj.job.job_id, placement.node_id))
        super()._start(sj, placement, resume_at=resume_at)


def _jobs() -> list[TraceJob]:
    """Two jobs of 5,000 s on a V100 from the start, and a third arriving at 1,000 s (its
    arrival is when the script looks again)."""
    jobs = gavel_synthetic(3, 1.0, 1, multi_gpu=False, gpus_per_node=1)
    truth = Truth()
    return [
        replace(
            j, arrival_s=1000.0 if i == 2 else 0.0, work=truth.rate(j.job_class, "v100", 1) * 5000
        )
        for i, j in enumerate(jobs)
    ]


def test_a_move_onto_a_stopping_jobs_gpu_restarts_there_once_it_has_stopped() -> None:
    sim = _Recording(NODES, _jobs(), _Script(), Truth(), SimConfig(gossip_delay_s=0.0))
    sim.log = []
    sim.run()
    moved = [(t, node) for t, job_id, node in sim.log if job_id == "j000000"]
    assert moved[0] == (0.0, "n1")
    (t_move, node), *_ = moved[1:]
    assert node == "n2" and t_move == 1000.0 + sim.config.grace_s
    assert sim.declines == 0  # it was not offered v's GPU while v still held it
    assert sim.jobs["j000000"].state == "done" and sim.jobs["j000001"].state == "pending"


def test_a_restart_after_a_preemption_forgets_an_earlier_move() -> None:
    sim = Simulation(NODES, _jobs(), _Script(), Truth(), SimConfig(gossip_delay_s=0.0))
    sj = sim.jobs["j000000"]
    sim._start(sj, ON_N1)
    sj.moved_at = 5.0  # moved early in that attempt
    sim.now = 2000.0
    sim._stop("j000000", preempted=True)
    sim._release(sj, ON_N1)
    sim.now = 3000.0
    sim._start(sj, ON_N1)
    r = sim.running["j000000"]
    assert r.started_at == 3000.0 and r.moved_at is None
