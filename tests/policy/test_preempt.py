"""Preemption: the least work lost since the last checkpoint, never a job of equal or higher
priority, and a minimum run time that keeps jobs from preempting each other in a loop."""

from __future__ import annotations

import dataclasses

from agent.policy.config import PolicyConfig
from agent.policy.decision import decide
from agent.policy.model import ThroughputModel
from agent.policy.snapshot import Snapshot
from tests.policy.helpers import holding, job, node, running

NOW = 100_000.0


def _fleet(*victims: tuple[str, int, bool, float, float]) -> tuple[Snapshot, list[str]]:
    """One node, one GPU per victim: (id, priority, preemptible, started_at, checkpoint_at)."""
    n = node("n", "v100", len(victims))
    runs = []
    for i, (job_id, priority, preemptible, started, ckpt) in enumerate(victims):
        j = job(job_id, priority=priority, preemptible=preemptible)
        n = holding(n, j, [i])
        runs.append(running(j, "n", [f"n/{i}"], started_at=started, checkpoint_at=ckpt))
    return Snapshot(now=NOW, nodes=(n,), running=tuple(runs)), [v[0] for v in victims]


def _with(snap: Snapshot, *pending: object) -> Snapshot:
    return Snapshot(snap.now, snap.nodes, tuple(pending), snap.running)  # type: ignore[arg-type]


def test_the_victim_is_the_one_that_loses_least_since_its_checkpoint() -> None:
    snap, _ = _fleet(
        ("checkpointed-long-ago", 0, True, 0.0, NOW - 3000.0),
        ("checkpointed-just-now", 0, True, 0.0, NOW - 60.0),
    )
    d = decide(_with(snap, job("urgent", priority=5)), ThroughputModel())
    assert len(d.preemptions) == 1
    p = d.preemptions[0]
    assert p.victims == ("checkpointed-just-now",)
    assert abs(p.lost_gpu_s - 60.0) < 1e-6
    a = d.assignment("urgent")
    assert a is not None and a.after == ("checkpointed-just-now",)
    assert a.placement.devices == (("n/1",),)


def test_fewest_victims_for_a_multi_gpu_job() -> None:
    snap, _ = _fleet(*((f"v{i}", 0, True, 0.0, NOW - 100.0 * (i + 1)) for i in range(4)))
    d = decide(_with(snap, job("urgent", priority=5, gpus_per_node=2)), ThroughputModel())
    assert d.preemptions[0].victims == ("v0", "v1")


def test_never_a_job_of_equal_or_higher_priority_or_one_not_preemptible() -> None:
    snap, _ = _fleet(
        ("equal", 5, True, 0.0, 0.0),
        ("higher", 9, True, 0.0, 0.0),
        ("not-preemptible", 0, False, 0.0, 0.0),
    )
    d = decide(_with(snap, job("urgent", priority=5)), ThroughputModel())
    assert d.preemptions == () and d.assignments == ()
    assert (d.waiting_line("urgent") or "").startswith("waiting: no node has 1 free GPU")


def test_minimum_run_time_guards_against_preemption_loops() -> None:
    """A job that started (or was moved) less than ``min_run_s`` ago is not stopped again: the
    preemptor waits until the guard expires, so two jobs cannot evict each other in turn."""
    config = PolicyConfig(min_run_s=600.0)
    snap, _ = _fleet(("just-started", 0, True, NOW - 300.0, None))  # type: ignore[arg-type]
    early = decide(_with(snap, job("urgent", priority=5)), ThroughputModel(), config)
    assert early.preemptions == ()
    later = Snapshot(NOW + 300.0, snap.nodes, (job("urgent", priority=5),), snap.running)
    d = decide(later, ThroughputModel(), config)
    assert [p.victims for p in d.preemptions] == [("just-started",)]
    moved = running(job("moved", priority=0, preemptible=True), "n", ["n/0"], started_at=0.0)
    moved = dataclasses.replace(moved, moved_at=NOW)
    n = holding(node("n", "v100", 1), moved.job, [0])
    again = Snapshot(NOW + 60.0, (n,), (job("urgent", priority=5),), (moved,))
    assert decide(again, ThroughputModel(), config).preemptions == ()


def test_preemption_can_be_turned_off() -> None:
    snap, _ = _fleet(("low", 0, True, 0.0, 0.0))
    d = decide(
        _with(snap, job("urgent", priority=5)), ThroughputModel(), PolicyConfig(preemption=False)
    )
    assert d.preemptions == ()


def test_time_slicing_gives_a_fresh_job_its_turn_from_one_of_its_priority_served_far_more() -> None:
    """Tiresias's discretized least attained service, among preemptible jobs of one priority."""
    config = PolicyConfig(time_slice=(3600.0, 36_000.0))
    served = running(job("served", preemptible=True), "n", ["n/0"], started_at=NOW - 7200.0)
    n = holding(node("n", "v100", 1), served.job, [0])
    fresh = job("fresh", preemptible=True)
    d = decide(Snapshot(NOW, (n,), (fresh,), (served,)), ThroughputModel(), config)
    assert [p.victims for p in d.preemptions] == [("served",)]  # 2 GPU-hours against none
    # The same level (both under an hour of a GPU): it waits its turn.
    recent = dataclasses.replace(served, started_at=NOW - 1800.0)
    d = decide(Snapshot(NOW, (n,), (fresh,), (recent,)), ThroughputModel(), config)
    assert d.preemptions == ()
    # A job that may not be stopped does not stop others for its turn; nor without slicing.
    firm = job("firm", preemptible=False)
    assert (
        decide(Snapshot(NOW, (n,), (firm,), (served,)), ThroughputModel(), config).preemptions == ()
    )
    off = PolicyConfig(time_slice=())
    assert (
        decide(Snapshot(NOW, (n,), (fresh,), (served,)), ThroughputModel(), off).preemptions == ()
    )


def test_time_slicing_queues_the_job_served_more_behind_the_others_of_its_priority() -> None:
    from agent.policy.queue import queue_order

    old = dataclasses.replace(job("old", preemptible=True), attained_gpu_s=7200.0)
    new = dataclasses.replace(job("new", preemptible=True), submitted_at=50.0)
    urgent = dataclasses.replace(job("urgent", priority=5), attained_gpu_s=1e6)
    assert [j.job_id for j in queue_order([new, old, urgent], (3600.0,))] == [
        "urgent",
        "new",
        "old",
    ]
    assert [j.job_id for j in queue_order([new, old, urgent])] == ["urgent", "old", "new"]
