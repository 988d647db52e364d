"""The placement workload of ``shoal demo --policy``: seeded, a mix the live mesh accepts, jobs
the policy sees with their class, and the figures computed from the jobs as the mesh lists them."""

from __future__ import annotations

import random
from pathlib import Path

from agent.job.jobspec import SUPPORTED_FEATURES, JobSpec
from agent.policy import adapt
from agent.policy.gavel import gavel_model
from agent.policy.model import ThroughputModel
from agent.sandbox.demoload import (
    CLASSES,
    FLEET,
    HOST_DATASETS,
    draw_job,
    job_spec,
    lay_out_datasets,
    offer_counts,
    placement_figures,
)
from probers.sim import REFERENCE_HOSTS


def _draw(seed: int, n: int = 400) -> list:
    rng = random.Random(seed)
    return [draw_job(rng) for _ in range(n)]


def test_the_same_seed_draws_the_same_workload() -> None:
    assert _draw(7) == _draw(7)
    assert _draw(7) != _draw(8)


def test_the_mix_has_every_ingredient_it_promises() -> None:
    jobs = _draw(1)
    assert {j.job_class for j in jobs} == {c for c, _ in CLASSES}
    assert all(gavel_model(j.job_class) is not None for j in jobs)  # Gavel's measured classes
    assert {j.kind for j in jobs} == {"training", "inference"}
    assert {j.gpus for j in jobs} == {1, 2, 4}
    assert {j.priority for j in jobs} == {0, 1}
    assert any(j.deadline_in_s for j in jobs) and any(j.deadline_in_s is None for j in jobs)
    assert {d for j in jobs for d in j.datasets} == {"imagenet", "wikitext"}
    assert any(j.backends for j in jobs)
    assert all(15.0 <= j.work_s <= 60.0 for j in jobs)
    assert {(j.nodes, j.gpus) for j in jobs if j.nodes > 1} == {(2, 2)}  # gangs
    assert {j.kind for j in jobs if j.share} == {"inference"}  # halves of one GPU
    assert {j.priority for j in jobs if j.preemptible} == {0}  # the higher priority may take


def test_each_spec_is_one_the_live_mesh_runs_and_the_policy_sees_its_class() -> None:
    now = 1_800_000_000.0
    for job in _draw(3, 60):
        spec = job_spec(job, now)
        assert JobSpec.from_dict(spec.to_dict()) == spec  # what the API reads back
        assert set(spec.features) <= SUPPORTED_FEATURES  # nothing main refuses
        seen = adapt.job_from_spec("j", spec)
        assert seen.job_class == job.job_class
        assert seen.kind == job.kind and seen.gpus_per_node == job.gpus
        assert seen.datasets == job.datasets and seen.priority == job.priority
        if job.deadline_in_s is None:
            assert spec.deadline is None
        else:
            assert spec.deadline == now + job.deadline_in_s
        assert spec.command[1:4] == ("-m", "agent.sandbox.synthjob", "--class")


def test_datasets_are_laid_out_as_sparse_files_of_their_size(tmp_path: Path) -> None:
    dirs = [tmp_path / f"agent-{i}" / "datasets" for i in range(4)]
    lay_out_datasets(dirs)
    assert (dirs[1] / "imagenet").stat().st_size == HOST_DATASETS[1]["imagenet"]
    assert (dirs[3] / "wikitext").stat().st_size == HOST_DATASETS[3]["wikitext"]
    assert not dirs[0].exists()  # host 0 holds none; hosts beyond the mesh are skipped


def test_the_fleet_mixes_fast_and_slow_gpus_for_every_class() -> None:
    """The spread the workload rewards: every class is several times faster on the fleet's
    fastest GPUs than on its slowest, and fast GPUs are a minority of the fleet."""
    model = ThroughputModel()
    fleet = [
        (s.groups[0][0], s.groups[0][1]) if (s := REFERENCE_HOSTS.get(p)) else _split(p)
        for p in FLEET
    ]
    assert len({m for m, _ in fleet}) == len(FLEET)
    for job_class, kind in CLASSES:
        speeds = {m: model.relative(job_class, kind, m) for m, _ in fleet}
        assert max(speeds.values()) > 4 * min(speeds.values()), (job_class, speeds)
    gpus = sum(n for _, n in fleet)
    assert sum(n for m, n in fleet if m in {"h100", "mi300x"}) <= gpus / 3


def _split(profile: str) -> tuple[str, int]:
    name, _, count = profile.partition(":")
    return name, int(count or 1)


def _job(state: str, finished: float | None, attempts: list, runner: str = "n1") -> dict:
    return {
        "state": state,
        "started_at": attempts[-1]["started_at"],
        "finished_at": finished,
        "runner": runner,
        "devices": ["d0"],
        "attempts": attempts,
    }


def test_the_figures_come_from_the_jobs_as_listed() -> None:
    a = {"attempt": 1, "started_at": 101.0, "finished_at": 110.0, "cause": "exit"}
    jobs = {
        "fast": _job("succeeded", 110.0, [a]),
        "slow": _job(
            "succeeded",
            160.0,
            [
                {"attempt": 1, "started_at": 101.0, "finished_at": 130.0, "cause": "migrate"},
                {"attempt": 2, "started_at": 125.0, "finished_at": 160.0, "cause": "exit"},
            ],
            runner="n2",
        ),
        "bumped": _job(
            "succeeded",
            150.0,
            [
                {"attempt": 1, "started_at": 101.0, "finished_at": 120.0, "cause": "preempt"},
                {"attempt": 2, "started_at": 121.0, "finished_at": 150.0, "cause": "exit"},
            ],
        ),
        "failed": _job("failed", 105.0, [a]),
    }
    submitted = dict.fromkeys(jobs, 100.0)
    deadlines = {"fast": 115.0, "slow": 140.0, "lost": 200.0}
    models = {("n1", "d0"): "h100", ("n2", "d0"): "l4"}
    figures = placement_figures(jobs, submitted, deadlines, models)
    assert figures["avg_jct_s"] == 40.0  # (10 + 60 + 50) / 3: succeeded jobs only
    assert figures["p99_jct_s"] == 60.0
    assert figures["avg_queue_s"] == 15.67  # before the last attempt: (1 + 25 + 21) / 3
    assert figures["deadline_misses"] == 2  # "slow" ended late, "lost" never ended
    assert figures["jobs_with_deadline"] == 3
    assert figures["preemptions"] == 1 and figures["migrations"] == 1
    assert figures["jobs_run_twice_concurrently"] == 1  # "slow"'s attempts overlapped
    assert figures["jobs_by_model"] == {"h100": 3, "l4": 1}


def test_an_attempt_still_running_overlaps_any_later_one() -> None:
    attempts = [
        {"attempt": 1, "started_at": 1.0, "finished_at": None},
        {"attempt": 2, "started_at": 50.0, "finished_at": 60.0},
    ]
    jobs = {"j": _job("running", None, attempts)}
    figures = placement_figures(jobs, {"j": 0.0}, {}, {})
    assert figures["jobs_run_twice_concurrently"] == 1
    assert figures["avg_jct_s"] is None and figures["avg_queue_s"] is None
    assert figures["jobs_by_model"] == {"?": 1}


def test_the_members_of_one_gang_attempt_are_one_attempt_not_two_at_once() -> None:
    members = [
        {"attempt": 1, "rank": 0, "started_at": 1.0, "finished_at": 20.0, "cause": "lost"},
        {"attempt": 1, "rank": 1, "started_at": 1.2, "finished_at": 21.0, "cause": "fenced"},
        {"attempt": 2, "rank": 0, "started_at": 22.0, "finished_at": 40.0, "cause": "exit"},
        {"attempt": 2, "rank": 1, "started_at": 22.1, "finished_at": 40.5, "cause": "exit"},
    ]
    jobs = {"g": _job("succeeded", 40.5, members)}
    assert placement_figures(jobs, {"g": 0.0}, {}, {})["jobs_run_twice_concurrently"] == 0
    late = [*members[:1], {**members[1], "finished_at": 23.0}, *members[2:]]  # rank 1 outlived
    jobs = {"g": _job("succeeded", 40.5, late)}
    assert placement_figures(jobs, {"g": 0.0}, {}, {})["jobs_run_twice_concurrently"] == 1


def test_offers_are_summed_over_the_agents_metrics() -> None:
    lines = [
        "# HELP shoal_placements_total Offers of jobs to runners, by outcome",
        "# TYPE shoal_placements_total counter",
        'shoal_placements_total{outcome="declined"} 2.0',
        'shoal_placements_total{outcome="started"} 7.0',
        'shoal_placements_created{outcome="started"} 1.7e+09',
        'shoal_placements_total{outcome="started"} 3.0',
        'shoal_commands_accepted_total{kind="submit"} 10.0',
    ]
    assert offer_counts(lines) == {"declined": 2, "started": 10}
