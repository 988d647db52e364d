"""Jobs their team is owed are placed in the pass that stops them or leaves them waiting
(:mod:`agent.policy.owed`), and a team's jobs do not take one another's GPUs by time slicing
while a start of the team is in flight."""

from __future__ import annotations

from agent.policy.config import PolicyConfig
from agent.policy.decision import decide
from agent.policy.model import ThroughputModel
from agent.policy.snapshot import Job, Node, Running, Snapshot
from agent.policy.state import PolicyState
from agent.policy.teams import TeamQuota, Teams
from tests.policy.helpers import holding, job, node, running

NOW = 100_000.0
CONFIG = PolicyConfig()
SERVED = 50 * 3600.0
"""Service past the second time-slicing level (10 GPU-hours)."""


def _on(n: Node, j: Job, first: int) -> tuple[Node, Running]:
    keys = list(range(first, first + j.gpus_per_node))
    r = running(j, n.node_id, [f"{n.node_id}/{k}" for k in keys], started_at=NOW - SERVED)
    return holding(n, j, keys), r


def _teams(guaranteed: float, **starting: float) -> Teams:
    return Teams((TeamQuota("a", guaranteed, 64), TeamQuota("c", 64, 64)), {}, starting)


def test_a_victim_its_team_is_owed_restarts_in_the_same_pass() -> None:
    """a-new may run on the V100 only; the team holds 2 of its 4, borrows nothing back (no one
    borrows), so it takes a-wide's V100 by time slicing. a-wide is owed then (2 of 4 held): it
    goes to the idle K80 at once, starting once it has stopped, instead of waiting a grace
    period to find it."""
    wide = job("a-wide", team="a", preemptible=True)
    other = job("a-other", team="a", preemptible=True)
    v100, r_wide = _on(node("v", "v100", 1), wide, 0)
    k80, r_other = _on(node("k", "k80", 2), other, 0)
    new = job("a-new", team="a", preemptible=True, models=("v100",), submitted_at=NOW - 10.0)
    snap = Snapshot(NOW, (v100, k80), (new,), (r_wide, r_other), teams=_teams(4))
    d = decide(snap, ThroughputModel(), CONFIG, state=PolicyState())
    assert [p.victims for p in d.preemptions] == [("a-wide",)]
    again = d.assignment("a-wide")
    assert again is not None and again.after == ("a-wide",), d.assignments
    assert again.placement.devices == (("k/1",),)


def test_a_job_stopping_since_an_earlier_pass_is_placed_while_it_stops() -> None:
    """a-stopping was stopped for another of its team's jobs; its team is below its guarantee
    and a GPU is idle: it is placed there now, its start waiting for its own stop. Without
    teams it waits until it has stopped, as any job."""
    n = node("n", "v100", 2)
    stopping = job("a-stopping", team="a", preemptible=True, attained_gpu_s=SERVED)
    snap = Snapshot(NOW, (n,), (), (), teams=_teams(4), stopping=(stopping,))
    d = decide(snap, ThroughputModel(), CONFIG, state=PolicyState())
    start = d.assignment("a-stopping")
    assert start is not None and start.after == ("a-stopping",), d.assignments
    plain = Snapshot(NOW, (n,), (), (), stopping=(stopping,))
    assert decide(plain, ThroughputModel(), CONFIG, state=PolicyState()).assignments == ()


def test_a_job_left_waiting_starts_on_what_a_later_time_slice_of_its_team_frees() -> None:
    """a-due (a deadline: first in the queue; not preemptible: it takes no one's turn) finds no
    room while team a holds all 9 it is guaranteed. Then a-new takes a GPU of a-big's node by
    time slicing, and the team holds 2: a-due is looked at again and starts on another of
    a-big's GPUs once a-big has stopped, in the same pass."""
    big = job("a-big", team="a", preemptible=True, gpus_per_node=8)
    one = job("a-one", team="a")  # not preemptible
    n1, r_big = _on(node("n1", "v100", 8), big, 0)
    n2, r_one = _on(node("n2", "v100", 1), one, 0)
    due = job("a-due", team="a", deadline=NOW + 10 * 86_400.0, submitted_at=NOW - 20.0)
    new = job("a-new", team="a", preemptible=True, submitted_at=NOW - 10.0)
    snap = Snapshot(NOW, (n1, n2), (due, new), (r_big, r_one), teams=_teams(9))
    d = decide(snap, ThroughputModel(), CONFIG, state=PolicyState())
    assert [p.victims for p in d.preemptions] == [("a-big",)]
    start = d.assignment("a-due")
    assert start is not None and start.after == ("a-big",), d.assignments
    assert start.placement.node_id == "n1"


def test_no_time_slicing_within_a_team_while_a_start_of_it_is_in_flight() -> None:
    """a-new would take a-old's GPU by time slicing; while a start of team a waits for its
    victims to stop (the team's GPUs in flight), it waits instead."""
    old = job("a-old", team="a", preemptible=True)
    n, r_old = _on(node("n", "v100", 1), old, 0)
    new = job("a-new", team="a", preemptible=True, submitted_at=NOW - 10.0)
    idle = Snapshot(NOW, (n,), (new,), (r_old,), teams=_teams(1))
    d = decide(idle, ThroughputModel(), CONFIG, state=PolicyState())
    assert [p.victims for p in d.preemptions] == [("a-old",)]
    landing = Snapshot(NOW, (n,), (new,), (r_old,), teams=_teams(1, a=1.0))
    d = decide(landing, ThroughputModel(), CONFIG, state=PolicyState())
    assert d.preemptions == () and d.assignment("a-new") is None


def test_a_reclaim_takes_a_job_borrowed_gpus_are_part_of_when_nothing_else_frees_a_node() -> None:
    """Team a holds 2 of its 4 and needs 2 GPUs of one node; team b borrows 3 GPUs as part of
    its 4-GPU job, which no reclaim of what was borrowed could take. That job is reclaimed: b is
    left 1 below its guarantee, less than the 2 a was. Where b would be left as far below its
    guarantee as a is (b guaranteed 3: 3 below), it is not."""
    b_job = job("b-four", team="b", preemptible=True, gpus_per_node=4)
    c_job = job("c-four", team="c", preemptible=True, gpus_per_node=4)
    a_job = job("a-two", team="a", preemptible=True, gpus_per_node=2)
    n1, r_b = _on(node("n1", "v100", 4), b_job, 0)
    n2, r_c = _on(node("n2", "v100", 4), c_job, 0)
    n3, r_a = _on(node("n3", "v100", 2), a_job, 0)
    owed = job("a-owed", team="a", preemptible=True, gpus_per_node=2, submitted_at=NOW - 10.0)
    config = PolicyConfig(time_slice=())

    def snap(b_guaranteed: float) -> Snapshot:
        quotas = (TeamQuota("a", 4, 8), TeamQuota("b", b_guaranteed, 8), TeamQuota("c", 64, 64))
        return Snapshot(NOW, (n1, n2, n3), (owed,), (r_b, r_c, r_a), teams=Teams(quotas))

    d = decide(snap(1), ThroughputModel(), config, state=PolicyState())
    assert [p.victims for p in d.preemptions] == [("b-four",)]
    start = d.assignment("a-owed")
    assert start is not None and start.after == ("b-four",)
    d = decide(snap(3), ThroughputModel(), config, state=PolicyState())
    assert d.preemptions == () and d.assignment("a-owed") is None
