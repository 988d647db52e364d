"""``bench.sched``'s Gavel under the two cost terms: ``paper`` (free preemption, true speeds) and
``same`` (the mesh's: the work since the last checkpoint lost, the restart paid)."""

from __future__ import annotations

import dataclasses

import pytest

from bench.sched.cluster import nodes_from_spec
from bench.sched.gavel_sim import ROUND_S, Costs, GavelSim
from bench.sched.traces import TraceJob, gavel_synthetic
from bench.sched.truth import Truth

pytest.importorskip("scipy")


def _two_jobs_on_one_gpu(rounds_of_work: float) -> tuple[list[TraceJob], Truth]:
    """Two one-GPU jobs of one class, each ``rounds_of_work`` rounds long on a V100, both
    there from the start: Gavel gives each half the GPU, round about."""
    truth = Truth()
    (base,) = gavel_synthetic(1, 1.0, 1, multi_gpu=False, gpus_per_node=8)
    rate = truth.rate(base.job_class, "v100", 1)
    jobs = [
        dataclasses.replace(
            base, index=i, arrival_s=0.0, gpus=1, work=rate * ROUND_S * rounds_of_work
        )
        for i in range(2)
    ]
    return jobs, truth


def test_paper_terms_preempt_for_free() -> None:
    jobs, truth = _two_jobs_on_one_gpu(3)
    g = GavelSim(nodes_from_spec("v100:1", 8), jobs, truth, costs=Costs("paper"))
    g.run()
    assert all(j.finish is not None for j in g.jobs)
    assert g.preemptions > 0 and g.lost_gpu_s == 0.0
    assert max(j.finish or 0.0 for j in g.jobs) == pytest.approx(6 * ROUND_S)


def test_same_terms_lose_the_work_since_the_last_checkpoint_and_pay_the_restart() -> None:
    jobs, truth = _two_jobs_on_one_gpu(3)
    costs = Costs("same", checkpoint_s=100.0, grace_s=30.0, restart_s=60.0)
    g = GavelSim(nodes_from_spec("v100:1", 8), jobs, truth, round_s=ROUND_S, costs=costs)
    g.run()
    assert all(j.finish is not None for j in g.jobs)
    assert g.preemptions > 0
    # each stop loses what it ran since its last checkpoint: something, never a whole interval
    assert 0.0 < g.lost_gpu_s < 100.0 * g.preemptions
    assert max(j.finish or 0.0 for j in g.jobs) > 6 * ROUND_S + g.lost_gpu_s


def test_same_terms_stop_a_run_that_cannot_end() -> None:
    """A Gavel that stops jobs every round, with rounds shorter than the checkpoint interval:
    two alternating jobs lose every round's work; the run stops at its horizon with both
    unfinished instead of running for ever."""
    jobs, truth = _two_jobs_on_one_gpu(3)
    g = GavelSim(
        nodes_from_spec("v100:1", 8),
        jobs,
        truth,
        round_s=ROUND_S,
        costs=Costs("same"),
        keep_until_checkpoint=False,
    )
    g.run()
    assert g.gave_up_at is not None
    assert all(j.finish is None for j in g.jobs)


def test_a_fair_gavel_under_same_terms_stops_a_job_only_past_a_checkpoint() -> None:
    """The Gavel the benchmark runs under ``same``: a job goes on until its run has passed a
    checkpoint less than a round old, so the two jobs that never end above both end, and no
    stop loses more than one round of work."""
    jobs, truth = _two_jobs_on_one_gpu(8)
    costs = Costs("same", checkpoint_s=1000.0)
    g = GavelSim(nodes_from_spec("v100:1", 8), jobs, truth, round_s=ROUND_S, costs=costs)
    g.run()
    assert g.gave_up_at is None
    assert all(j.finish is not None for j in g.jobs)
    assert g.kept > 0 and g.preemptions > 0
    assert g.lost_gpu_s <= ROUND_S * g.preemptions
    # rounds under ``same`` are longer unless told
    assert GavelSim(nodes_from_spec("v100:1", 8), jobs, truth, costs=costs).round_s > ROUND_S
