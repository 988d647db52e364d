"""The simulated mesh's stops: a job stopping is not placed again before it has stopped (the
devices it left moving earlier are freed meanwhile), and a start that waits for a job stopping
since an earlier pass goes ahead once that job has stopped, not a whole grace period later."""

from __future__ import annotations

from dataclasses import replace

from agent.policy.snapshot import Placement, Snapshot
from bench.sched.cluster import NodeSpec
from bench.sched.engine import Simulation
from bench.sched.simtypes import MoveOrder, Plan, SimConfig, SimJob, Start
from bench.sched.traces import TraceJob, gavel_synthetic
from bench.sched.truth import Truth

GIB = 1024**3
NODES = [NodeSpec(f"n{i}", "v100", 1, 32 * GIB) for i in (1, 2, 3)]
ON = {i: Placement((f"n{i}",), ((f"n{i}/0",),)) for i in (1, 2, 3)}
X = "j000000"


def _jobs(*arrivals: float) -> list[TraceJob]:
    """x from the start (10,000 s of work on a V100), then jobs arriving at ``arrivals`` (their
    arrivals are when the scripts look again; they never start)."""
    jobs = gavel_synthetic(1 + len(arrivals), 1.0, 1, multi_gpu=False, gpus_per_node=1)
    work = Truth().rate(jobs[0].job_class, "v100", 1) * 10_000
    return [replace(j, arrival_s=([0.0, *arrivals])[i], work=work) for i, j in enumerate(jobs)]


class _Recording(Simulation):
    log: list[tuple[float, str, str]]

    def _start(self, sj: SimJob, placement: Placement, *, resume_at: float | None = None) -> None:
        self.log.append((self.now, sj.job.job_id, placement.node_id))
        super()._start(sj, placement, resume_at=resume_at)


def _run(script: object, *arrivals: float) -> _Recording:
    sim = _Recording(NODES, _jobs(*arrivals), script, Truth(), SimConfig(gossip_delay_s=0.0))  # type: ignore[arg-type]
    sim.log = []
    sim.run()
    return sim


class _MoveThenStop:
    """x starts on n1; at 1,000 s it moves to n2 (idle: it leaves n1 30 s later); at 1,010 s it
    is stopped; whenever it waits again, it starts on n3."""

    name = "script"
    central = False

    def plan(self, snapshot: Snapshot, sim: Simulation) -> Plan:
        waiting = {j.job_id for j in snapshot.pending}
        if sim.now == 0.0:
            return Plan(starts=(Start(X, (ON[1],)),))
        if sim.now == 1000.0:
            return Plan(moves=(MoveOrder(X, ON[2]),))
        if sim.now == 1010.0:
            return Plan(stops=(X,))
        return Plan(starts=(Start(X, (ON[3],)),)) if X in waiting else Plan()


def test_a_job_stopped_after_a_move_waits_for_its_own_stop_not_the_moves() -> None:
    sim = _run(_MoveThenStop(), 1000.0, 1010.0)
    starts = [(t, node) for t, job_id, node in sim.log if job_id == X]
    assert starts[:2] == [(0.0, "n1"), (1000.0, "n2")]
    assert starts[2] == (1010.0 + sim.config.grace_s, "n3"), starts


class _RestartWhileStopping:
    """x starts on n1 and is stopped at 1,000 s; at 1,010 s, while it stops, the policy starts
    it on n3 once it has stopped (``after`` names it)."""

    name = "script"
    central = False

    def __init__(self) -> None:
        self.stopping: tuple[str, ...] = ()

    def plan(self, snapshot: Snapshot, sim: Simulation) -> Plan:
        if sim.now == 0.0:
            return Plan(starts=(Start(X, (ON[1],)),))
        if sim.now == 1000.0:
            return Plan(stops=(X,))
        if sim.now == 1010.0:
            self.stopping = tuple(j.job_id for j in snapshot.stopping)
            return Plan(starts=(Start(X, (ON[3],), after=(X,)),))
        return Plan()


def test_a_job_stopping_since_an_earlier_pass_restarts_once_it_has_stopped() -> None:
    script = _RestartWhileStopping()
    sim = _run(script, 1000.0, 1010.0)
    assert script.stopping == (X,)  # the pass saw it stopping (not waiting)
    starts = [(t, node) for t, job_id, node in sim.log if job_id == X]
    assert starts == [(0.0, "n1"), (1000.0 + sim.config.grace_s, "n3")], starts
    assert sim.declines == 0
