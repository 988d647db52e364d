"""Defragmentation by moving: a team below its guarantee whose job needs several GPUs of one node
gets a node emptied for it when the fleet's idle GPUs are scattered and nothing is borrowed to
take back; the node is held for it until it starts."""

from __future__ import annotations

from dataclasses import replace

from agent.policy.config import PolicyConfig
from agent.policy.decision import decide
from agent.policy.model import ThroughputModel
from agent.policy.snapshot import Job, Node, Running, Snapshot
from agent.policy.state import PolicyState
from agent.policy.teams import TeamQuota, Teams
from tests.policy.helpers import holding, job, node, running

CONFIG = PolicyConfig(time_slice=())
MOVES_ONLY = PolicyConfig(time_slice=(), preemption=False)
"""Without preemption the start-after-moves plan (:mod:`agent.policy.guarantee`, tested in
``test_guarantee.py``) is not made, and defragmentation's node hold is what makes room."""
TEAMS = Teams((TeamQuota("a", 4, 12), TeamQuota("b", 8, 8)))


def _fleet(layout: dict[str, list[str]]) -> tuple[tuple[Node, ...], tuple[Running, ...]]:
    """4-GPU V100 nodes; ``layout``: node id -> the team-b 1-GPU jobs on its first devices."""
    nodes, runs = [], []
    for node_id, job_ids in layout.items():
        n = node(node_id, "v100", 4)
        for i, job_id in enumerate(job_ids):
            j = job(job_id, team="b", preemptible=True)
            n = holding(n, j, [i])
            runs.append(running(j, node_id, [f"{node_id}/{i}"], started_at=0.0))
        nodes.append(n)
    return tuple(nodes), tuple(runs)


def _big() -> Job:
    return job("a-big", team="a", gpus_per_node=4, preemptible=True, submitted_at=500.0)


def test_scattered_idle_gpus_are_gathered_on_one_node_for_a_team_below_its_guarantee() -> None:
    nodes, runs = _fleet({"n1": ["b0", "b1"], "n2": ["b2", "b3"], "n3": ["b4", "b5"]})
    snap = Snapshot(now=1000.0, nodes=nodes, pending=(_big(),), running=runs, teams=TEAMS)
    state = PolicyState()
    d = decide(snap, ThroughputModel(), MOVES_ONLY, state=state)
    assert not d.assignments and not d.preemptions  # b holds 6 of its 8: nothing to take back
    moved = {m.job_id: m.placement.node_id for m in d.moves}
    assert len(moved) == 2, d.moves
    emptied = {r.placement.node_id for r in runs if r.job.job_id in moved}
    assert len(emptied) == 1  # both from one node, each onto another node
    (target,) = emptied
    assert all(dest != target for dest in moved.values())
    assert state.defrag["a-big"][0] == target
    # a second pass before the moves land plans nothing more for the same job
    again = decide(snap, ThroughputModel(), MOVES_ONLY, state=state)
    assert not again.moves

    # the moves landed: the emptied node goes to the big job, not to the job ahead of it
    layout: dict[str, list[str]] = {n.node_id: [] for n in nodes}
    for r in runs:
        layout[moved.get(r.job.job_id, r.placement.node_id)].append(r.job.job_id)
    nodes2, runs2 = _fleet(layout)
    early = job("b-early", team="b", preemptible=True, submitted_at=100.0)
    snap2 = Snapshot(now=1100.0, nodes=nodes2, pending=(early, _big()), running=runs2, teams=TEAMS)
    d2 = decide(snap2, ThroughputModel(), MOVES_ONLY, state=state)
    placed = {a.job_id: a.placement.node_id for a in d2.assignments}
    assert placed["a-big"] == target
    assert placed.get("b-early") != target  # it takes an idle GPU elsewhere, if any
    later = Snapshot(now=1110.0, nodes=nodes2, pending=(), running=runs2, teams=TEAMS)
    decide(later, ThroughputModel(), MOVES_ONLY, state=state)
    assert not state.defrag  # its plan ends once it no longer waits


def test_without_a_guarantee_owed_no_job_is_moved_for_a_big_one() -> None:
    """The same fleet with no teams: under load, a whole node for one big job is paid for by the
    jobs it moves and those that wait behind it; only a guarantee is worth that."""
    nodes, runs = _fleet({"n1": ["b0", "b1"], "n2": ["b2", "b3"], "n3": ["b4", "b5"]})
    snap = Snapshot(now=1000.0, nodes=nodes, pending=(_big(),), running=runs)
    d = decide(snap, ThroughputModel(), CONFIG, state=PolicyState())
    assert not d.moves and not d.assignments


def test_no_plan_when_the_moved_jobs_would_have_nowhere_to_go() -> None:
    """Three jobs on each of two nodes: one idle GPU per node, and no node can be emptied of
    its jobs onto the other's single idle GPU."""
    nodes, runs = _fleet({"n1": ["b0", "b1", "b2"], "n2": ["b3", "b4", "b5"]})
    snap = Snapshot(now=1000.0, nodes=nodes, pending=(_big(),), running=runs, teams=TEAMS)
    state = PolicyState()
    d = decide(snap, ThroughputModel(), CONFIG, state=state)
    assert not d.moves and not state.defrag


def test_jobs_that_started_moments_ago_are_not_moved() -> None:
    nodes, runs = _fleet({"n1": ["b0", "b1"], "n2": ["b2", "b3"], "n3": ["b4", "b5"]})
    fresh = tuple(
        running(r.job, r.placement.node_id, r.placement.devices[0], started_at=900.0) for r in runs
    )
    snap = Snapshot(now=1000.0, nodes=nodes, pending=(_big(),), running=fresh, teams=TEAMS)
    d = decide(snap, ThroughputModel(), CONFIG, state=PolicyState())
    assert not d.moves


def test_no_node_is_emptied_whose_cpu_the_job_would_not_fit() -> None:
    """The node emptied with the CPU to spare is not, once its CPU left after its jobs go is
    1 core where the job needs 4: another is emptied instead."""
    nodes, runs = _fleet({"n1": ["b0", "b1"], "n2": ["b2", "b3"], "n3": ["b4", "b5"]})
    big = replace(_big(), cpu_milli=4000)
    snap = Snapshot(now=1000.0, nodes=nodes, pending=(big,), running=runs, teams=TEAMS)
    state = PolicyState()
    decide(snap, ThroughputModel(), MOVES_ONLY, state=state)
    first = state.defrag["a-big"][0]  # the control: with the CPU to spare
    short = tuple(
        replace(n, cpu_milli_total=8000, cpu_milli_used=7000) if n.node_id == first else n
        for n in nodes
    )
    state = PolicyState()
    d = decide(replace(snap, nodes=short), ThroughputModel(), MOVES_ONLY, state=state)
    assert state.defrag["a-big"][0] != first and len(d.moves) == 2, d.moves
