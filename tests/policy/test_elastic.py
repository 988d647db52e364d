"""Elastic jobs in the policy: the most GPUs up to the job's maximum that fit on a node now, never
fewer than its minimum; one policy for the owner, the runner's admission and ``decide``."""

from __future__ import annotations

from agent.job.jobspec import JobSpec, Resources
from agent.policy import apply
from agent.policy.baselines import first_fit
from agent.policy.config import PolicyConfig
from agent.policy.decision import context, decide, rank_any
from agent.policy.grow import grow_to
from agent.policy.model import ThroughputModel
from agent.policy.shrink import Shrink, shrink_for
from agent.policy.snapshot import Job, Running, Snapshot
from agent.running.admission import offer_problem
from tests.policy.helpers import job, node, running


def sizes(*nodes: object, least: int = 2, most: int = 4) -> list[tuple[str, int]]:
    snapshot = Snapshot(now=0.0, nodes=tuple(nodes))  # type: ignore[arg-type]
    ctx, _ = context(snapshot, ThroughputModel())
    j = job("e", gpus_per_node=least, gpus_max_per_node=most)
    return [(c.node_id, len(c.placement.devices[0])) for c in rank_any(j, ctx, limit=10)]


def test_the_most_gpus_that_fit_up_to_the_maximum() -> None:
    assert sizes(node("a", "h100", 8))[0] == ("a", 4)  # never more than the maximum
    assert sizes(node("a", "h100", 4, busy=(0,)))[0] == ("a", 3)
    assert sizes(node("a", "h100", 4, busy=(0, 1)))[0] == ("a", 2)
    assert sizes(node("a", "h100", 4, busy=(0, 1, 2))) == []  # never fewer than the minimum
    # The largest size any node has room for, on the nodes that have it.
    fleet = [node("a", "h100", 4, busy=(0, 1)), node("b", "h100", 4, busy=(0,))]
    assert sizes(*fleet) == [("b", 3)]


def test_first_fit_takes_the_first_node_with_its_fewest_and_as_many_as_free_there() -> None:
    elastic = job("e", gpus_per_node=2, gpus_max_per_node=4)
    fleet = [node("a", "h100", 4, busy=(0, 1, 2)), node("b", "h100", 4, busy=(0,))]
    fleet.append(node("c", "h100", 8))
    assert [len(p.devices[0]) for p in first_fit(elastic, fleet)] == [3, 4]


def test_decide_starts_it_at_that_size_and_says_why_it_waits() -> None:
    elastic = job("e", gpus_per_node=2, gpus_max_per_node=4)
    free = Snapshot(now=0.0, nodes=(node("a", "h100", 4, busy=(3,)),), pending=(elastic,))
    (start,) = decide(free, ThroughputModel()).assignments
    assert len(start.placement.devices[0]) == 3
    full = Snapshot(now=0.0, nodes=(node("a", "h100", 4, busy=(1, 2, 3)),), pending=(elastic,))
    line = decide(full, ThroughputModel()).waiting_line("e") or ""
    assert "2 free GPUs (it takes up to 4)" in line, line


def test_the_runner_admits_any_count_in_the_range() -> None:
    spec = JobSpec(command=("x",), resources=Resources(gpus_per_node=2, gpus_max_per_node=4))
    here = node("a", "h100", 8)
    keys = [d.key for d in here.devices]
    assert offer_problem(spec, here, keys[:2]) is None
    assert offer_problem(spec, here, keys[:4]) is None
    for n in (1, 5):
        problem = offer_problem(spec, here, keys[:n])
        assert problem == f"offered {n} device(s) for a job of 2-4 on this node"


def test_the_submit_form_reads_a_range() -> None:
    from tui.screens.submit import spec_from_form

    spec = spec_from_form({"command": "train", "gpus": "2-4"}, now=0.0)
    assert spec.resources == Resources(gpus_per_node=2, gpus_max_per_node=4)


def test_an_elastic_job_above_its_minimum_is_shrunk_for_a_job_that_waits() -> None:
    elastic = job("e", gpus_per_node=2, gpus_max_per_node=4)
    full = node("a", "h100", 4)
    held = running(elastic, "a", [d.key for d in full.devices], started_at=0.0)

    def shrink(pending: Job, runs: list[Running], now: float = 100.0) -> Shrink | None:
        snapshot = Snapshot(now=now, nodes=(full,), running=tuple(runs))
        ctx, _ = context(snapshot, ThroughputModel(), PolicyConfig(min_run_s=30.0))
        for r in runs:
            apply.take(ctx.index, r.job, r.placement)
        return shrink_for(pending, ctx, {"a": runs})

    found = shrink(job("p", gpus_per_node=2), [held])
    assert found is not None
    assert found.victims == ("e",) and len(found.placement.devices[0]) == 2
    assert shrink(job("p", gpus_per_node=3), [held]) is None  # it would go below its minimum
    assert shrink(job("p", gpus_per_node=2), [held], now=10.0) is None  # too soon since it started
    at_least = running(elastic, "a", [d.key for d in full.devices][:2], started_at=0.0)
    assert shrink(job("p", gpus_per_node=1), [at_least]) is None  # already at its fewest
    plain = running(job("q", gpus_per_node=4), "a", [d.key for d in full.devices], started_at=0.0)
    assert shrink(job("p", gpus_per_node=1), [plain]) is None  # only an elastic job shrinks


def test_an_elastic_job_grows_onto_idle_gpus_unless_a_waiting_job_could_use_them() -> None:
    elastic = job("e", gpus_per_node=2, gpus_max_per_node=4)
    half = node("a", "h100", 8, busy=(2, 3, 4, 5))  # it holds two of the busy ones, say
    assert grow_to(elastic, 2, half, []) == 4  # never past its most
    assert grow_to(elastic, 3, node("a", "h100", 4, busy=(0, 1, 2)), []) == 4
    assert grow_to(elastic, 2, node("a", "h100", 4), []) == 4
    assert grow_to(elastic, 4, node("a", "h100", 8), []) is None  # at its most already
    assert grow_to(elastic, 2, node("a", "h100", 2, busy=(0, 1)), []) is None  # nothing idle
    # A job that waits and could start on the idle GPUs comes first; one that could not does not.
    assert grow_to(elastic, 2, half, [job("w", gpus_per_node=2)]) is None
    assert grow_to(elastic, 2, half, [job("w", gpus_per_node=5)]) == 4
    assert grow_to(elastic, 2, half, [job("w", gpus_per_node=1, backends=("rocm",))]) == 4
    assert grow_to(elastic, 2, half, [job("w", gpus_per_node=0)]) == 4


def test_the_tui_shows_what_an_elastic_job_holds_and_its_range() -> None:
    from tui.decode import job_from_json
    from tui.widgets.views import job_gpus

    spec = JobSpec(command=("x",), resources=Resources(gpus_per_node=2, gpus_max_per_node=4))
    doc = {"job_id": "e" * 32, "state": "running", "attempt": 1, "spec": spec.to_dict()}
    assert job_gpus(job_from_json({**doc, "devices": ["a", "b", "c"]})) == "3 (2-4)"
    assert job_gpus(job_from_json({**doc, "state": "pending"})) == "(2-4)"
    plain = {**doc, "spec": JobSpec(command=("x",), resources=Resources(gpus_per_node=2)).to_dict()}
    assert job_gpus(job_from_json(plain)) == "2"
