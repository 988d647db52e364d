"""Team quotas' sans-I/O parts: the held policy turned into the pure policy's teams, the
decayed usage read from the job records, the runner's count against a maximum and a reclaim,
and the quota desk's grants (``agent.job.teamquota``, ``agent.running.teamdesk``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agent.job import teamquota as quotas
from agent.job.jobspec import JobSpec, Resources, new_job_id
from agent.job.ownership import rank
from agent.owning.teamquotas import quotas_of, teams_now
from agent.running.preemption import Ask, Refused, arbitrate
from agent.running.runs import Declined
from agent.running.teamdesk import GRANT_KEPT_S, TeamDesk
from agent.wire.policy import Person, PolicyBody, Quota, Team
from agent.wire.quotacalls import QuotaClaim, QuotaGrant
from agent.wire.records import JobStatus
from tests.agent.test_preemption import NOW, Fleet, Run


def policy(operator_id: str, *quota: Quota, team: str = "vision") -> PolicyBody:
    return PolicyBody(
        version=1,
        issued_at=NOW,
        teams=(Team(team, None, tuple(quota)), Team("nlp", None, (Quota("any", 0, 8),))),
        users=(Person("alice", team, "user", operator_id),),
    )


def test_the_policy_quotas_become_the_policys_and_any_means_every_model() -> None:
    body = policy("op", Quota("any", 1, 2), Quota("H100", 0, 1))
    got = quotas_of(body)
    assert [(q.team, q.guaranteed_gpus, q.max_gpus, q.model) for q in got] == [
        ("vision", 1.0, 2.0, None),
        ("vision", 0.0, 1.0, "H100"),
        ("nlp", 0.0, 8.0, None),
    ]
    assert quotas.who_signed(body, "op") == ("vision", "alice")
    assert quotas.who_signed(body, "stranger") == ("", "")
    assert quotas.who_signed(None, "op") == ("", "")
    bare = PolicyBody(1, NOW, (Team("vision", None),), (Person("alice", "vision", "user", "op"),))
    assert teams_now(bare, {}, {}, NOW) is None  # no quota: nothing to enforce


def test_a_maximum_counts_any_model_and_its_own_model_and_says_why_in_one_line() -> None:
    body = policy("op", Quota("any", 0, 3), Quota("H100", 0, 1))
    held = quotas.held_by_team(
        [("j1", 1.0, "H100"), ("j2", 1.0, "MI300X")], {"j1": ("vision", "a"), "j2": ("vision", "a")}
    )
    assert held[("vision", None)] == 2.0 and held[("vision", "H100")] == 1.0
    assert quotas.over_max(body, "vision", 1.0, "MI300X", held) is None
    why = quotas.over_max(body, "vision", 1.0, "H100", held)
    assert why is not None and "maximum of 1 GPUs of H100" in why and "\n" not in why
    assert quotas.over_max(body, "vision", 2.0, "MI300X", held) is not None  # any: 2 + 2 > 3
    assert quotas.over_max(body, "", 9.0, "H100", held) is None  # no team: no quota


def test_a_reclaim_takes_back_only_what_another_team_borrowed() -> None:
    body = policy("op", Quota("any", 2, 4))
    held = {("vision", None): 1.0, ("nlp", None): 3.0}  # nlp's guarantee: 0, so all borrowed
    assert quotas.reclaim_allows(body, "vision", 1.0, {"n1": ("nlp", 1.0)}, held) is None
    over = quotas.reclaim_allows(body, "vision", 2.0, {"n1": ("nlp", 2.0)}, held)
    assert over is not None and "more than its guarantee" in over
    own = quotas.reclaim_allows(body, "vision", 1.0, {"v1": ("vision", 1.0)}, held)
    assert own is not None
    tight = {("vision", None): 0.0, ("nlp", None): 1.0}
    body2 = PolicyBody(
        1,
        NOW,
        (Team("vision", None, (Quota("any", 2, 4),)), Team("nlp", None, (Quota("any", 1, 4),))),
        (),
    )
    assert quotas.reclaim_allows(body2, "vision", 1.0, {"n1": ("nlp", 1.0)}, tight) is not None


def test_a_runner_lets_a_reclaim_stop_a_job_of_equal_priority_and_nothing_else_does() -> None:
    runs = {"borrowed": Run(1, ("g0",), priority=5)}
    with pytest.raises(Refused, match="not lower"):
        arbitrate(Ask("new", 5, ("g0",), ("borrowed",)), runs, (), (), NOW, 60.0)
    assert arbitrate(
        Ask("new", 5, ("g0",), ("borrowed",), reclaim=True), runs, (), (), NOW, 60.0
    ) == ("borrowed",)


def test_usage_decays_by_when_each_attempt_ended_and_counts_team_and_user(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, 1)
    node = fleet.ids[0]
    body = policy(fleet.kit.cluster.operator.node_id, Quota("any", 0, 4))
    job_id = new_job_id()
    spec = JobSpec(command=("train",), resources=Resources(gpus_per_node=2))
    owner = rank(job_id, fleet.ids)[0]
    fleet.view.apply(owner, "sub/" + job_id, fleet.kit.submission(job_id, spec), NOW)
    week = quotas.HALF_LIFE_S
    doc = {
        "attempts": [
            {"attempt": 1, "node": node, "started_at": NOW - week - 100, "finished_at": NOW - week},
            {"attempt": 2, "node": node, "started_at": NOW - 10, "finished_at": None},
        ]
    }
    now = teams_now(body, {job_id: doc}, fleet.view.submissions, NOW)
    assert now is not None
    # 100 s x 2 GPUs a half-life ago (100), and 10 s x 2 GPUs running now (20)
    assert now.teams.usage_ref_s["vision"] == pytest.approx(120.0)
    assert now.teams.usage_ref_s["vision/alice"] == pytest.approx(120.0)
    assert now.who[job_id] == ("vision", "alice")


def desk_over(fleet: Fleet, body: PolicyBody, clock: list[float]) -> TeamDesk:
    ctx: Any = SimpleNamespace(
        node_id=fleet.ids[0],
        view=fleet.view,
        policy=lambda: body,
        authority=fleet.view.authority,
        mesh=SimpleNamespace(live_agents=lambda: [fleet.ids[0]], addr_of=lambda n: None),
    )
    return TeamDesk(ctx, lambda: (), {}, clock=lambda: clock[0])


def claim(fleet: Fleet, desk: TeamDesk) -> tuple[str, QuotaGrant]:
    job_id = new_job_id()
    spec = JobSpec(command=("train",), resources=Resources(gpus_per_node=1))
    sealed = fleet.kit.submission(job_id, spec)
    ask = QuotaClaim.from_wire(QuotaClaim(job_id, 1, 1.0, "H100", sealed).to_wire())
    return job_id, desk.grant(ask, fleet.ids[0])


def test_the_desk_counts_its_grants_until_the_view_shows_them_and_grants_one_at_a_time(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path, 2)
    body = policy(fleet.kit.cluster.operator.node_id, Quota("any", 0, 2))
    clock = [100.0]
    desk = desk_over(fleet, body, clock)
    running = fleet.run(fleet.ids[1], 0, NOW - 60)  # one of vision's, as gossip says
    first, granted = claim(fleet, desk)
    assert granted.granted
    second, refused = claim(fleet, desk)  # the first is not in any record yet: still counted
    assert not refused.granted and "maximum of 2 GPUs" in refused.reason
    owner = rank(first, fleet.ids)[0]
    spec = JobSpec(command=("train",), resources=Resources(gpus_per_node=1))
    fleet.view.apply(owner, "sub/" + first, fleet.kit.submission(first, spec), NOW)
    ended = JobStatus(first, "succeeded", 1, owner, fleet.ids[0], gen=9)
    assert fleet.view.apply(owner, "job/" + first, ended.encode(), NOW) == first
    assert claim(fleet, desk)[1].granted  # the first ended: its grant is dropped
    assert not claim(fleet, desk)[1].granted
    clock[0] += GRANT_KEPT_S + 1  # a grant never seen running is forgotten in time
    assert claim(fleet, desk)[1].granted
    assert desk.counts["granted"] == 3 and desk.counts["denied"] == 2
    assert running and second


def test_the_desks_own_run_stays_counted_by_its_grant_until_its_submission_comes(
    tmp_path: Path,
) -> None:
    """The desk runs a job it granted; the offer brought the submission, gossip has not yet:
    the desk cannot tell the run's team from its view, so it goes on counting the grant."""
    fleet = Fleet(tmp_path, 2)
    body = policy(fleet.kit.cluster.operator.node_id, Quota("any", 0, 1))
    desk = desk_over(fleet, body, [100.0])
    first, granted = claim(fleet, desk)
    assert granted.granted
    runs = cast(dict[str, Any], desk._runs)
    runs[first] = SimpleNamespace(devices=("g0",), share_bytes=None)
    assert first not in fleet.view.submissions
    assert not claim(fleet, desk)[1].granted
    spec = JobSpec(command=("train",), resources=Resources(gpus_per_node=1))
    owner = rank(first, fleet.ids)[0]
    fleet.view.apply(owner, "sub/" + first, fleet.kit.submission(first, spec), NOW)
    assert not claim(fleet, desk)[1].granted  # now counted as the desk's own run


def test_a_runner_asks_no_desk_for_a_team_without_a_maximum_and_declines_on_a_refusal(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path, 1)
    body = policy(fleet.kit.cluster.operator.node_id, Quota("any", 0, 0))
    desk = desk_over(fleet, body, [0.0])
    job_id = new_job_id()
    spec = JobSpec(command=("train",), resources=Resources(gpus_per_node=1))
    sub = fleet.view.authority.submission(fleet.kit.submission(job_id, spec), job_id)
    with pytest.raises(Declined, match="maximum of 0 GPUs"):
        asyncio.run(desk.claim(sub, 1, ("g0",)))
    nobody = PolicyBody(1, NOW, (Team("vision", None),), ())
    free = desk_over(fleet, nobody, [0.0])
    asyncio.run(free.claim(sub, 1, ("g0",)))  # no team, no quota: nothing asked
    assert free.counts["granted"] == 0


def test_a_gang_is_cleared_with_the_desk_for_all_its_members_gpus(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, 1)
    body = policy(fleet.kit.cluster.operator.node_id, Quota("any", 0, 4))
    desk = desk_over(fleet, body, [0.0])
    job_id = new_job_id()
    spec = JobSpec(command=("train",), resources=Resources(gpus_per_node=2, nodes=2))
    sub = fleet.view.authority.submission(fleet.kit.submission(job_id, spec), job_id)
    asyncio.run(desk.claim(sub, 1, ("g0", "g1")))  # rank 0's two devices: the gang's four
    assert desk.grants[job_id][1] == 4.0
    with pytest.raises(Declined, match="maximum of 4 GPUs"):
        other = new_job_id()
        one = JobSpec(command=("train",), resources=Resources(gpus_per_node=1))
        asyncio.run(
            desk.claim(
                fleet.view.authority.submission(fleet.kit.submission(other, one), other), 1, ("g2",)
            )
        )
