"""Queue order (priority, earliest deadline, age), EASY backfill, and the deadline answer at
submission."""

from __future__ import annotations

from agent.policy.decision import decide
from agent.policy.model import ThroughputModel
from agent.policy.queue import queue_order
from agent.policy.snapshot import Snapshot
from agent.policy.submit import check_submission
from tests.policy.helpers import holding, job, node, running


def test_priority_then_earliest_deadline_then_age() -> None:
    jobs = [
        job("old", submitted_at=1.0),
        job("young", submitted_at=2.0),
        job("late-deadline", submitted_at=3.0, deadline=500.0),
        job("early-deadline", submitted_at=4.0, deadline=100.0),
        job("urgent", submitted_at=5.0, priority=5),
    ]
    order = [j.job_id for j in queue_order(reversed(jobs))]
    assert order == ["urgent", "early-deadline", "late-deadline", "old", "young"]


def test_the_earliest_deadline_gets_the_only_gpu() -> None:
    snap = Snapshot(
        now=0.0,
        nodes=(node("n", "v100", 1),),
        pending=(
            job("a", submitted_at=1.0, deadline=9e9),
            job("b", submitted_at=2.0, deadline=5e3),
        ),
    )
    d = decide(snap, ThroughputModel())
    assert [a.job_id for a in d.assignments] == ["b"]
    assert d.waiting_line("a") is not None and d.waiting_line("a").startswith("waiting:")


def test_easy_backfill_never_delays_the_reserved_job() -> None:
    """The 4-GPU head waits for node a (two GPUs busy until ~1 h); one-GPU jobs may start on
    node b, which the reservation does not need, but not on a's two free GPUs."""
    blocker = job("blocker")
    a = holding(node("a", "v100", 4), blocker, [0, 1])
    b = node("b", "v100", 1)
    r = running(blocker, "a", ["a/0", "a/1"], progress=0.5, rate=0.5 / 3600, progress_at=3600.0)
    head = job("head", gpus_per_node=4, submitted_at=1.0)
    small = tuple(job(f"s{i}", submitted_at=2.0 + i) for i in range(3))
    d = decide(
        Snapshot(now=3600.0, nodes=(a, b), pending=(head, *small), running=(r,)), ThroughputModel()
    )
    assert [res.job_id for res in d.reservations] == ["head"]
    assert d.reservations[0].node_ids == ("a",)
    started = {x.job_id: x.placement.node_id for x in d.assignments}
    assert started == {"s0": "b"}
    assert all(x.backfilled for x in d.assignments)
    assert "frees 4 GPUs in ~60 min" in (d.waiting_line("head") or "")
    assert "would delay job head" in (d.waiting_line("s1") or "")


def test_a_job_that_can_never_fit_is_told_so() -> None:
    snap = Snapshot(now=0.0, nodes=(node("n", "v100", 2),))
    check = check_submission(job("j", gpus_per_node=4), snap, ThroughputModel())
    assert check.never_fits and check.refuse
    assert check.line == "never fits: no node has 4 matching GPUs on one node"


def test_an_infeasible_deadline_is_known_at_submission() -> None:
    """A job whose work takes ~1 h on a V100 cannot end within 10 minutes: refused or queued
    with a warning, as its spec asks; a reachable deadline is met."""
    snap = Snapshot(now=0.0, nodes=(node("n", "v100", 1),))
    model = ThroughputModel()
    tight = job("j", deadline=600.0, deadline_action="refuse")
    check = check_submission(tight, snap, model)
    assert check.deadline_met is False and check.refuse
    assert check.line.startswith("deadline cannot be met: predicted end ~")
    assert check.line.endswith("; refused")
    queued = check_submission(job("j", deadline=600.0), snap, model)
    assert queued.deadline_met is False and not queued.refuse
    assert queued.line.endswith("queued with a warning")
    easy = check_submission(job("j", deadline=10 * 86400.0), snap, model)
    assert easy.deadline_met is True and not easy.refuse
    assert easy.line.startswith("starts now, ends in ~")
    assert easy.forecast is not None and easy.forecast.end_p90 >= easy.forecast.end_p50


def test_a_busy_fleet_forecasts_a_later_start() -> None:
    blocker = job("blocker")
    n = holding(node("n", "v100", 1), blocker, [0])
    r = running(blocker, "n", ["n/0"], progress=0.25, rate=0.25 / 3600, progress_at=3600.0)
    check = check_submission(
        job("j"), Snapshot(now=3600.0, nodes=(n,), running=(r,)), ThroughputModel()
    )
    assert check.forecast is not None
    assert abs(check.forecast.start_p50 - (3600.0 + 3 * 3600.0)) < 1.0
    assert check.line.startswith("starts in ~3.0 h")


def test_a_waiting_gang_is_forecast_on_every_member() -> None:
    """Each node's one GPU is busy for an hour; a 2-node gang's forecast names both nodes it
    would start on (the owner asks each to pre-fetch), not only the first."""
    nodes, runs = [], []
    for name in ("a", "b", "c"):
        blocker = job(f"hold-{name}")
        nodes.append(holding(node(name, "v100", 1), blocker, [0]))
        ends = 0.5 if name == "c" else 0.9  # c frees last
        runs.append(running(blocker, name, [f"{name}/0"], progress=ends, rate=ends / 3600,
                            progress_at=3600.0))  # fmt: skip
    gang = job("g", nodes=2)
    d = decide(
        Snapshot(now=3600.0, nodes=tuple(nodes), pending=(gang,), running=tuple(runs)),
        ThroughputModel(),
        forecasts=True,
    )
    fc = d.forecasts["g"]
    assert sorted(fc.node_ids) == ["a", "b"] and fc.node_id in ("a", "b")


def test_a_job_with_an_image_goes_only_to_a_linux_host_with_a_runtime() -> None:
    mac = node("mac", "v100", 2, os="darwin", features=frozenset({"image"}))
    bare = node("bare", "v100", 2, os="linux", features=frozenset({"gang"}))
    boxed = job("j", gpus_per_node=2, features=("image",))
    check = check_submission(boxed, Snapshot(now=0.0, nodes=(mac, bare)), ThroughputModel())
    assert check.never_fits
    assert check.line == "never fits: no Linux host with a container runtime and 2 GPUs"
    ready = node("ready", "v100", 2, os="linux", features=frozenset({"image"}))
    d = decide(Snapshot(now=0.0, nodes=(mac, bare, ready), pending=(boxed,)), ThroughputModel())
    assert [(a.job_id, a.placement.node_id) for a in d.assignments] == [("j", "ready")]
