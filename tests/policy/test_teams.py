"""Teams in the pure policy: a maximum holds, idle GPUs are borrowed beyond a guarantee, a team
below its guarantee takes GPUs back from the borrowers, and fair share orders the queue."""

from __future__ import annotations

import pytest

from agent.policy.config import PolicyConfig
from agent.policy.decision import decide
from agent.policy.model import ThroughputModel
from agent.policy.queue import queue_order
from agent.policy.snapshot import Job, Node, Running, Snapshot
from agent.policy.teams import FairShare, TeamQuota, Teams
from tests.policy.helpers import holding, job, node, running

NO_SLICING = PolicyConfig(time_slice=())


def _held(n: Node, jobs: list[Job]) -> tuple[Node, tuple[Running, ...]]:
    runs = []
    for i, j in enumerate(jobs):
        n = holding(n, j, [i])
        runs.append(running(j, n.node_id, [f"{n.node_id}/{i}"], started_at=990.0))
    return n, tuple(runs)


def test_a_team_at_its_maximum_waits_and_says_so_while_another_starts() -> None:
    a_jobs = [job(f"a{i}", team="a") for i in range(2)]
    n, runs = _held(node("n", "v100", 4), a_jobs)
    teams = Teams((TeamQuota("a", 1, 2), TeamQuota("b", 1, 2)))
    pending = (job("a-next", team="a", submitted_at=1.0), job("b-next", team="b", submitted_at=2.0))
    snap = Snapshot(now=1000.0, nodes=(n,), pending=pending, running=runs, teams=teams)
    d = decide(snap, ThroughputModel(), NO_SLICING)
    assert [a.job_id for a in d.assignments] == ["b-next"]
    assert d.waiting_line("a-next") == (
        "waiting: team a would pass its maximum of 2 GPUs (2 in use, this job asks 1)"
    )
    # with no quotas the same snapshot starts both
    free = decide(
        Snapshot(now=1000.0, nodes=(n,), pending=pending, running=runs), ThroughputModel()
    )
    assert {a.job_id for a in free.assignments} == {"a-next", "b-next"}


def test_idle_gpus_are_borrowed_beyond_the_guarantee_up_to_the_maximum() -> None:
    teams = Teams((TeamQuota("a", 1, 3),))
    pending = tuple(job(f"a{i}", team="a", submitted_at=float(i)) for i in range(5))
    snap = Snapshot(now=0.0, nodes=(node("n", "v100", 8),), pending=pending, teams=teams)
    d = decide(snap, ThroughputModel(), NO_SLICING)
    assert [a.job_id for a in d.assignments] == ["a0", "a1", "a2"]


@pytest.mark.parametrize(("b_guaranteed", "reclaimed"), [(2.0, True), (4.0, False)])
def test_a_team_below_its_guarantee_takes_gpus_back_from_a_borrower(
    b_guaranteed: float, reclaimed: bool
) -> None:
    """Team b holds all 4 GPUs with jobs of the same priority that started 10 s ago; team a,
    guaranteed 2, gets one back at once, unless b holds no more than its own guarantee."""
    b_jobs = [job(f"b{i}", team="b", preemptible=True) for i in range(4)]
    n, runs = _held(node("n", "v100", 4), b_jobs)
    teams = Teams((TeamQuota("a", 2, 4), TeamQuota("b", b_guaranteed, 4)))
    pending = (job("a0", team="a", preemptible=True),)
    snap = Snapshot(now=1000.0, nodes=(n,), pending=pending, running=runs, teams=teams)
    d = decide(snap, ThroughputModel(), NO_SLICING)
    if reclaimed:
        assert [a.job_id for a in d.assignments] == ["a0"]
        assert len(d.preemptions) == 1 and d.preemptions[0].victims[0].startswith("b")
    else:
        assert not d.assignments and not d.preemptions


def test_fair_share_orders_teams_then_users_by_decayed_usage() -> None:
    usage = {"a": 100.0, "b": 10.0, "a/ann": 90.0, "a/al": 10.0}
    teams = Teams((TeamQuota("a", 1), TeamQuota("b", 1)), usage)
    jobs = [
        job("ann", team="a", user="ann", submitted_at=1.0),
        job("al", team="a", user="al", submitted_at=2.0),
        job("bo", team="b", user="bo", submitted_at=3.0),
        job("urgent", team="a", user="ann", priority=1, submitted_at=4.0),
    ]
    assert [j.job_id for j in queue_order(jobs, (), teams)] == ["urgent", "bo", "al", "ann"]
    assert [j.job_id for j in queue_order(jobs)] == ["urgent", "ann", "al", "bo"]


def test_fair_share_usage_halves_every_half_life() -> None:
    fs = FairShare(half_life_s=100.0)
    fs.add("a", "ann", 80.0, now=0.0)
    fs.add("b", "bo", 10.0, now=100.0)
    u = fs.usage(200.0, {"b": 5.0})
    assert u["a"] == pytest.approx(20.0) and u["a/ann"] == pytest.approx(20.0)
    assert u["b"] == pytest.approx(10.0) and u["b/bo"] == pytest.approx(5.0)


def test_what_a_team_is_guaranteed_starts_before_what_another_borrows() -> None:
    """One GPU free; team b already holds its guarantee, team a holds nothing: a's job starts
    though b's came first."""
    n, runs = _held(node("n", "v100", 2), [job("b-run", team="b")])
    teams = Teams((TeamQuota("a", 1, 2), TeamQuota("b", 1, 2)))
    pending = (job("b-next", team="b", submitted_at=1.0), job("a-next", team="a", submitted_at=2.0))
    snap = Snapshot(now=1000.0, nodes=(n,), pending=pending, running=runs, teams=teams)
    d = decide(snap, ThroughputModel(), NO_SLICING)
    assert [a.job_id for a in d.assignments] == ["a-next"]
