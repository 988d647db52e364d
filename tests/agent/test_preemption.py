"""Preemption's sans-I/O parts: the runner's arbitration of a preempting offer, the running jobs
an owner builds from its gossip view, and the policy's choice of victims over them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import JobSpec, Resources, new_job_id
from agent.job.ownership import rank
from agent.mesh.view import ClusterView
from agent.owning.placement import FirstFit, ShoalPlacement
from agent.owning.preempting import (
    preemption_candidates,
    stopped_head,
    stopped_reason,
    waiting_reason,
)
from agent.policy import adapt
from agent.policy.config import PolicyConfig
from agent.policy.decision import decide
from agent.policy.snapshot import Running, Snapshot
from agent.policy.teams import TeamQuota, Teams
from agent.running.preemption import Ask, Preemptions, Refused, arbitrate
from agent.wire.calls import AttemptResult
from agent.wire.inventory import InventoryRecord
from agent.wire.records import JobStatus, NodeRecord
from probers.records import DeviceStatic, HostInfo
from tests.agent.authority_kit import Kit
from tests.policy.helpers import job as policy_job
from tests.policy.helpers import running as policy_running

NOW = 10_000.0
MIN_RUN_S = 600.0


@dataclass
class Run:
    """A job the runner runs (``agent.running.runs.LocalRun``'s fields that arbitration reads)."""

    attempt: int
    devices: tuple[str, ...]
    priority: int = 0
    preemptible: bool = True
    started_at: float | None = NOW - 3600
    gpus_min: int | None = None
    movable: bool = False


RUNS = {
    "low": Run(1, ("g0",)),
    "low2": Run(2, ("g1",)),
    "pinned": Run(1, ("g2",), preemptible=False),
    "peer": Run(1, ("g3",), priority=100),
    "fresh": Run(1, ("g4",), started_at=NOW - 5),
    "launching": Run(1, ("g5",), started_at=None),
    "elastic": Run(1, ("g7", "g8", "g9"), priority=100, preemptible=False, gpus_min=1),
    "least": Run(1, ("g10",), gpus_min=1),
    "young": Run(1, ("g11", "g12"), gpus_min=1, started_at=NOW - 5),
    "mover": Run(1, ("g13",), priority=100, preemptible=False, movable=True),
    "new-mover": Run(1, ("g14",), movable=True, started_at=NOW - 5),
}


def _arbitrate(
    victims: tuple[str, ...],
    devices: tuple[str, ...],
    priority: int = 100,
    claimed: tuple[str, ...] = (),
) -> tuple[str, ...]:
    ask = Ask("new", priority, devices, victims)
    return arbitrate(ask, RUNS, ("g6",), claimed, NOW, MIN_RUN_S)


def test_an_offer_preempts_only_what_runs_here_preemptible_lower_and_past_its_minimum() -> None:
    assert _arbitrate(("low",), ("g0",)) == ("low",)
    assert _arbitrate(("low", "low2", "low"), ("g0", "g1", "g6")) == ("low", "low2")
    refusals: list[tuple[tuple[str, ...], tuple[str, ...], dict[str, Any], str]] = [
        (("gone",), ("g0",), {}, "victim gone does not run here"),
        (("pinned",), ("g2",), {}, "victim pinned is not preemptible"),
        (("peer",), ("g3",), {}, "victim peer has priority 100, not lower than 100"),
        (("low",), ("g0",), {"priority": 0}, "victim low has priority 0, not lower than 0"),
        (("fresh",), ("g4",), {}, "victim fresh has run 5 s, less than the minimum 600 s"),
        (("launching",), ("g5",), {}, "victim launching has not started yet"),
        (("low",), ("g0",), {"claimed": ("low",)}, "victim low is being preempted already"),
        (("low",), ("g1",), {}, "victim low holds none of the offered devices"),
        (("low",), ("g0", "g1"), {}, "device g1 is in use"),
        (("new",), ("g0",), {}, "job new cannot preempt itself"),
    ]
    for victims, devices, kw, line in refusals:
        with pytest.raises(Refused) as refused:
            _arbitrate(victims, devices, **kw)
        assert str(refused.value) == line


def test_an_offer_shrinks_only_an_elastic_job_above_its_fewest_and_takes_what_that_frees() -> None:
    def shrink(victims: tuple[str, ...], devices: tuple[str, ...]) -> tuple[str, ...]:
        ask = Ask("new", 0, devices, (), victims)  # no priority needed
        return arbitrate(ask, RUNS, ("g6",), (), NOW, MIN_RUN_S)

    assert shrink(("elastic",), ("g7", "g8")) == ("elastic",)
    assert shrink(("elastic",), ("g6", "g9")) == ("elastic",)
    refusals = [
        (("low",), ("g0",), "victim low is not elastic: it cannot be shrunk"),
        (("least",), ("g10",), "victim least runs on its fewest GPUs (1) already"),
        (("elastic",), ("g7", "g8", "g9"), "the offer takes 3 of elastic's GPUs; a shrink frees 2"),
        (("young",), ("g11",), "victim young has run 5 s, less than the minimum 600 s"),
        (("elastic",), ("g6",), "victim elastic holds none of the offered devices"),
        (("elastic",), ("g7", "g0"), "device g0 is in use"),
    ]
    for victims, devices, line in refusals:
        with pytest.raises(Refused) as refused:
            shrink(victims, devices)
        assert str(refused.value) == line
    # Stopped with cause shrink, said as a shrink, counted apart.
    p = Preemptions(MIN_RUN_S, clock=lambda: NOW)
    ask = Ask("new", 0, ("g7",), (), ("elastic",))
    assert p.claim(ask, RUNS, ()) == ("elastic",)
    stopped: list[tuple[str, str]] = []
    noted: list[tuple[str, str, str]] = []

    async def stop(job_id: str, attempt: int, cause: str) -> None:
        stopped.append((job_id, cause))

    asyncio.run(p.stop(ask, ("elastic",), RUNS, stop, lambda *n: noted.append(n)))
    assert stopped == [("elastic", "shrink")]
    assert noted == [("elastic", "shrunk", "for new, attempt 1")]
    assert p.counts == {"shrunk": 1}
    assert p.stopped_for("elastic", 1) == "new"


def test_an_offer_moves_off_only_movable_jobs_and_only_for_a_job_its_team_is_owed() -> None:
    def move(
        victims: tuple[str, ...], devices: tuple[str, ...], owed: bool = True, saved: Any = None
    ) -> Any:
        ask = Ask("new", 0, devices, (), moves=victims, owed=owed)  # no priority needed
        saved = ("mover", "new-mover") if saved is None else saved
        return arbitrate(ask, RUNS, ("g6",), (), NOW, MIN_RUN_S, saved)

    # Neither preemptible nor of a lower priority: it restarts elsewhere, it is not stopped.
    assert move(("mover",), ("g13",)) == ("mover",)
    assert move(("mover",), ("g13", "g6")) == ("mover",)
    refusals = [
        (("mover",), ("g13",), False, "victim mover may be moved only for a job its team's "
         "guarantee is owed"),
        (("pinned",), ("g2",), True, "victim pinned cannot move (a gang, a share, inference or "
         "elastic)"),
        (("new-mover",), ("g14",), True, "victim new-mover has run 5 s, less than the minimum "
         "600 s"),
        (("mover",), ("g0",), True, "victim mover holds none of the offered devices"),
        (("mover",), ("g13", "g0"), True, "device g0 is in use"),
    ]  # fmt: skip
    for victims, devices, owed, line in refusals:
        with pytest.raises(Refused) as refused:
            move(victims, devices, owed)
        assert str(refused.value) == line
    # Not preemptible: moved only with a checkpoint saved here, else it would start over.
    with pytest.raises(Refused) as refused:
        move(("mover",), ("g13",), saved=())
    line = "victim mover is not preemptible and has saved no checkpoint to move with"
    assert str(refused.value) == line
    preemptible = {**RUNS, "mover": replace(RUNS["mover"], preemptible=True)}
    ask = Ask("new", 0, ("g13",), (), moves=("mover",), owed=True)
    assert arbitrate(ask, preemptible, (), (), NOW, MIN_RUN_S) == ("mover",)
    # A reclaim and a move in one offer: each stopped with its own cause, said and counted.
    p = Preemptions(MIN_RUN_S, clock=lambda: NOW)
    ask = Ask("new", 0, ("g0", "g13"), ("low",), reclaim=True, moves=("mover",), owed=True)
    assert p.claim(ask, RUNS, (), saved=("mover",)) == ("low", "mover")
    stopped: list[tuple[str, str]] = []
    noted: list[tuple[str, str, str]] = []

    async def stop(job_id: str, attempt: int, cause: str) -> None:
        stopped.append((job_id, cause))

    asyncio.run(p.stop(ask, ("low", "mover"), RUNS, stop, lambda *n: noted.append(n)))
    assert stopped == [("low", "preempt"), ("mover", "migrate")]
    assert noted[1] == ("mover", "moved", "off this node for new (its team's guarantee), attempt 1")
    assert p.counts == {"preempted": 1, "moved": 1}
    assert p.stopped_for("mover", 1) == "new"


def test_two_offers_racing_for_one_victim_do_not_both_win_and_the_report_names_the_winner() -> None:
    clock = [NOW]
    p = Preemptions(MIN_RUN_S, clock=lambda: clock[0])
    assert p.claim(Ask("a", 100, ("g0",), ("low",)), RUNS, ()) == ("low",)
    with pytest.raises(Refused, match="low is being preempted already"):
        p.claim(Ask("b", 200, ("g0",), ("low",)), RUNS, ())
    assert p.counts == {"refused": 1}
    stopped: list[tuple[str, int]] = []
    noted: list[tuple[str, str]] = []

    async def stop(job_id: str, attempt: int, cause: str) -> None:
        stopped.append((job_id, attempt))

    ask = Ask("a", 100, ("g0",), ("low",))
    asyncio.run(p.stop(ask, ("low",), RUNS, stop, lambda j, k, m: noted.append((j, m))))
    assert stopped == [("low", 1)]
    assert noted == [("low", "preempted by a (priority 100 over 0), attempt 1")]
    assert p.counts == {"refused": 1, "preempted": 1}
    assert p.stopped_for("low", 2) is None  # another attempt: not the one claimed
    assert p.stopped_for("low", 1) == "a"
    assert p.stopped_for("low", 1) is None  # the claim is released with the report
    # Released, the victim could be claimed again (were it still running).
    assert p.claim(Ask("b", 200, ("g0",), ("low",)), RUNS, ()) == ("low",)


def test_an_offer_declined_after_its_claim_gives_its_victims_back() -> None:
    p = Preemptions(MIN_RUN_S, clock=lambda: NOW)
    assert p.claim(Ask("a", 100, ("g0",), ("low",)), RUNS, ()) == ("low",)
    p.release(("low",))  # the runner's own checks then declined the offer: nothing stopped
    assert p.claim(Ask("b", 200, ("g0",), ("low",)), RUNS, ()) == ("low",)
    assert p.counts == {}


def test_a_preempted_job_says_by_whom_and_where_until_it_runs_again(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, 1)
    r = AttemptResult("v" * 32, 3, None, "SIGTERM", "preempt", 1.0, 2.0, "p" * 32)
    line = stopped_reason(r, fleet.ids[0], fleet.view)
    assert line == "preempted by pppppppp on host"  # the runner's host name, from its inventory
    assert stopped_reason(r, "node-abcdefgh", fleet.view) == "preempted by pppppppp on node-abc"
    drained = r._replace(cause="drain", preempted_by=None)
    assert stopped_reason(drained, "node-abcdefgh", fleet.view) == (
        "attempt 3 stopped on node-abc (drain)"
    )
    waiting = waiting_reason(line, "waiting: no node has 1 free GPU now")
    assert waiting == "preempted by pppppppp on host; waiting: no node has 1 free GPU now"
    assert waiting_reason(waiting, "waiting: no node has 1 free GPU now") == waiting
    assert waiting_reason("declined by x", "waiting") == "waiting"
    # Offered again and declined: still said first, until it runs again.
    declined = waiting_reason(line, "declined by node-abc: device g0 is in use")
    assert declined == "preempted by pppppppp on host; declined by node-abc: device g0 is in use"
    assert stopped_head(declined) == line and stopped_head("declined by x") is None
    moved = r._replace(cause="migrate")
    line = stopped_reason(moved, fleet.ids[0], fleet.view)
    assert line == (
        "moved off host for pppppppp (its team's guarantee): restarts from its checkpoint elsewhere"
    )
    assert waiting_reason(line, "waiting: no node has 1 free GPU now").startswith(line + "; ")
    mine = moved._replace(preempted_by=None)  # a user's own migration names nobody
    assert stopped_reason(mine, fleet.ids[0], fleet.view) == "attempt 3 stopped on " + (
        f"{fleet.ids[0][:8]} (migrate)"
    )


# -- the owner's side: running jobs from the view, victims from the policy -----------------------


def _statics(node: str, n: int, amd: int = 0) -> tuple[DeviceStatic, ...]:
    """``n`` H100s, the last ``amd`` of them MI300Xs instead."""
    return tuple(
        DeviceStatic(
            f"{node}-g{i}", "amd", "rocm", "AMD Instinct MI300X", "sim",
            mem_total_bytes=192 * 1024**3,
        )
        if i >= n - amd
        else DeviceStatic(
            f"{node}-g{i}", "nvidia", "cuda", "NVIDIA H100 80GB HBM3", "sim",
            mem_total_bytes=80 * 1024**3,
        )
        for i in range(n)
    )  # fmt: skip


class Fleet:
    """A real ``ClusterView`` fed what gossip brings: inventories, node records, operators'
    signed submissions and owners' job records."""

    def __init__(self, tmp_path: Path, nodes: int, amd: int = 0) -> None:
        self.kit = Kit(tmp_path)
        self.agents = [self.kit.agent(f"a{i}") for i in range(nodes)]
        self.ids = [a.node_id for a in self.agents]
        self.view = ClusterView(self.kit.authority(self.ids[0], lambda: self.ids, *self.agents))
        host = HostInfo("host", "linux", "x86_64", 8, None)
        for node in self.ids:
            inventory = InventoryRecord(host, None, {}, 1, _statics(node, 2, amd))
            for kind, payload in inventory.encode():
                self.view.apply(node, kind, payload, NOW)
            self.view.apply(node, "node", NodeRecord(free=()).encode(), NOW)

    def run(self, node: str, gpu: int, started_at: float, **spec_kw: object) -> str:
        job_id = new_job_id()
        spec = JobSpec(command=("train",), resources=Resources(gpus_per_node=1), **spec_kw)  # type: ignore[arg-type]
        owner = rank(job_id, self.ids)[0]
        self.view.apply(owner, "sub/" + job_id, self.kit.submission(job_id, spec), NOW)
        status = JobStatus(
            job_id, "running", 1, owner, node, (f"{node}-g{gpu}",), NOW - 7200, started_at, gen=2
        )
        assert self.view.apply(owner, "job/" + job_id, status.encode(), NOW) == job_id
        return job_id


def test_running_jobs_are_built_from_the_records_and_submissions_gossip_brings(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path, 2)
    a, b = fleet.ids
    low = fleet.run(a, 0, NOW - 3600, priority=0, preemptible=True)
    high = fleet.run(a, 1, NOW - 60, priority=50)
    gone = fleet.run(b, 0, NOW - 3600, preemptible=True)
    specs = {j: s.spec for j, s in fleet.view.submissions.items()}
    running = adapt.running_from_jobs(fleet.view.jobs, specs, live={a})
    by_id = {r.job.job_id: r for r in running}
    assert set(by_id) == {low, high}  # a job on a node that is not live is not running
    assert by_id[low].job.preemptible and by_id[low].job.priority == 0
    assert by_id[high].job.priority == 50 and not by_id[high].job.preemptible
    assert by_id[low].placement.node_ids == (a,)
    assert by_id[low].placement.devices == ((f"{a}-g0",),)
    assert by_id[low].started_at == NOW - 3600
    assert by_id[low].last_checkpoint_at is None
    saved = adapt.running_from_jobs(fleet.view.jobs, specs, live={a}, checkpoints={low: NOW - 5})
    assert {r.job.job_id: r.last_checkpoint_at for r in saved}[low] == NOW - 5
    # A job whose submission is not held is not known to run; nor a pending one.
    del specs[low]
    assert {r.job.job_id for r in adapt.running_from_jobs(fleet.view.jobs, specs, live={a, b})} == {
        high,
        gone,
    }
    assert adapt.holders(running)[a] == {f"{a}-g0": low, f"{a}-g1": high}


def test_the_policy_names_victims_only_of_lower_priority_preemptible_and_past_their_minimum(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path, 2)
    a, b = fleet.ids
    placement = ShoalPlacement(config=PolicyConfig(min_run_s=MIN_RUN_S), clock=lambda: NOW)
    urgent = JobSpec(command=("serve",), priority=100, resources=Resources(gpus_per_node=1))
    live = fleet.ids
    nodes = [fleet.view.node(n) for n in live]

    def choose(spec: JobSpec = urgent) -> list[tuple[str, tuple[str, ...]]]:
        found = preemption_candidates(placement, spec, nodes, fleet.view, live)
        return [(c.node_id, c.victims) for c in found]

    fleet.run(a, 0, NOW - 3600, priority=100, preemptible=True)  # equal priority
    fleet.run(a, 1, NOW - 3600, priority=0)  # not preemptible
    just_started = fleet.run(b, 0, NOW - 60, priority=0, preemptible=True)
    assert choose() == []
    # Equal priority never, on the live mesh, even for a job that has had more service.
    fleet.run(b, 1, NOW - 100_000, priority=100, preemptible=True)
    assert choose(replace(urgent, preemptible=True)) == []
    # Past its minimum run time, the low-priority preemptible job is the victim.
    placement.config = PolicyConfig(min_run_s=30.0)
    assert choose() == [(b, (just_started,))]
    assert FirstFit().preemption(urgent, nodes, ()) is None  # the baseline never preempts


def test_an_offer_names_only_victims_that_free_a_device_the_job_takes(tmp_path: Path) -> None:
    """The policy frees devices cheapest first: a victim on a GPU the job cannot use is not
    named (a runner would refuse the whole offer for it)."""
    fleet = Fleet(tmp_path, 1, amd=1)
    (a,) = fleet.ids
    on_amd = fleet.run(a, 1, NOW - 700, preemptible=True)  # the cheapest to stop
    on_nvidia = fleet.run(a, 0, NOW - 3600, preemptible=True)
    placement = ShoalPlacement(config=PolicyConfig(min_run_s=MIN_RUN_S), clock=lambda: NOW)
    cuda = JobSpec(
        command=("serve",), priority=100, resources=Resources(gpus_per_node=1, backends=("cuda",))
    )
    found = preemption_candidates(placement, cuda, [fleet.view.node(a)], fleet.view, [a])
    assert [(c.node_id, c.devices, c.victims) for c in found] == [(a, (f"{a}-g0",), (on_nvidia,))]
    assert on_amd not in found[0].victims


def test_the_victim_is_the_one_that_loses_least_since_its_runner_saw_it_checkpoint(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path, 2)
    a, b = fleet.ids
    older = fleet.run(a, 0, NOW - 3600, preemptible=True)
    newer = fleet.run(a, 1, NOW - 1800, preemptible=True)
    placement = ShoalPlacement(config=PolicyConfig(min_run_s=MIN_RUN_S), clock=lambda: NOW)
    urgent = JobSpec(command=("serve",), priority=100, resources=Resources(gpus_per_node=1))
    nodes = [fleet.view.node(n) for n in fleet.ids]

    def victims() -> tuple[str, ...]:
        (found,) = preemption_candidates(placement, urgent, nodes, fleet.view, fleet.ids)
        return found.victims

    assert victims() == (newer,)  # no checkpoint known: the work since each one started
    # Another node's word about a job it does not run is not taken.
    fleet.view.apply(b, "node", NodeRecord(free=(), saved={older: NOW - 10}).encode(), NOW)
    assert victims() == (newer,)
    # Its own runner's is: the older job saved 10 s ago and loses least.
    fleet.view.apply(a, "node", NodeRecord(free=(), saved={older: NOW - 10}).encode(), NOW)
    assert victims() == (older,)


def test_a_team_owed_a_node_is_offered_a_reclaim_and_a_move_there_and_only_there(
    tmp_path: Path,
) -> None:
    """Team ``a`` holds nothing of its 2 GPUs; no node has 2 free. On node x, ``b``'s borrowed
    job is reclaimed and ``c``'s (not preemptible) moves onto y's idle GPU: one offer to x's
    runner. When the GPU the move needs is one a reclaim on y would free, the live owner offers
    nothing (the plan would need y's runner too), though the simulator's policy plans it."""
    fleet = Fleet(tmp_path, 2)
    x, y = fleet.ids
    teams = Teams((TeamQuota("a", 2, 4), TeamQuota("b", 0, 4), TeamQuota("c", 100, 100)))

    def run(job_id: str, node_id: str, gpu: int, saved: bool = True) -> Running:
        team = job_id[0]
        j = policy_job(job_id, team=team, gpus_per_node=1, preemptible=team == "b")
        keys = [f"{node_id}-g{gpu}"]
        at = NOW - 60 if saved else None  # its runner saw it save a checkpoint
        return policy_running(j, node_id, keys, started_at=NOW - 3600, checkpoint_at=at)

    big = policy_job("a-big", team="a", gpus_per_node=2, submitted_at=NOW - 10)
    placement = ShoalPlacement(config=PolicyConfig(min_run_s=MIN_RUN_S), clock=lambda: NOW)
    fleet.view.apply(y, "node", NodeRecord(free=(f"{y}-g1",)).encode(), NOW + 1)
    nodes = [fleet.view.node(n) for n in fleet.ids]
    idle_y = (run("b0", x, 0), run("c1", x, 1), run("c2", y, 0))
    found = placement.reclaim(big, nodes, idle_y, teams)
    assert found is not None
    assert (found.node_id, set(found.devices)) == (x, {f"{x}-g0", f"{x}-g1"})
    assert (found.victims, found.moves) == (("b0",), ("c1",))
    # c1 is not preemptible: before it saved a checkpoint a move would start it over.
    unsaved = (run("b0", x, 0), run("c1", x, 1, saved=False), run("c2", y, 0))
    assert placement.reclaim(big, nodes, unsaved, teams) is None
    busy_y = (*idle_y, run("b3", y, 1))  # y's last GPU is borrowed too
    fleet.view.apply(y, "node", NodeRecord(free=()).encode(), NOW + 2)
    nodes = [fleet.view.node(n) for n in fleet.ids]
    assert placement.reclaim(big, nodes, busy_y, teams) is None
    snapshot = Snapshot(
        now=NOW,
        nodes=adapt.nodes_from_views(nodes, adapt.holders(busy_y)),
        pending=(big,),
        running=busy_y,
        teams=teams,
    )
    planned = decide(snapshot, placement.model, replace(placement.config, time_slice=()))
    # Either node freed: one c job moves onto the GPU that reclaiming the other node's b frees.
    assert [m.job_id for m in planned.moves] in (["c1"], ["c2"])
    assert {v for p in planned.preemptions for v in p.victims} == {"b0", "b3"}
