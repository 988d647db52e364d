"""Each ``python -m bench.sched`` command runs on a tiny size and emits the fields BENCHMARKS.md
lists (no timed asserts: those figures are the benchmark's, not the test suite's)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from bench.sched.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIELDS = (
    "policy", "jobs", "avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "utilization",
    "queue_delay_p50_s", "queue_delay_p99_s", "deadline_miss_rate", "unallocated_gpu_fraction",
    "decision_ms_p50", "decision_ms_p99",
)  # fmt: skip


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main([*args, "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _fields(result: dict[str, Any]) -> None:
    assert "error" not in result, result
    for key in FIELDS:
        assert key in result, key


def test_gavel_synthetic_sweep_every_policy_side_by_side(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = _run(
        capsys, "--trace", "gavel-synthetic", "--cluster", "v100:8,p100:8,k80:8",
        "--load", "2,8", "--jobs", "40", "--policy", "all", "--seed", "3",
    )  # fmt: skip
    assert [r["load"] for r in doc["runs"]] == [2.0, 8.0]
    for run in doc["runs"]:
        assert [r["policy"] for r in run["results"]] == ["fifo", "backfill", "gavel", "shoal"]
        for result in run["results"]:
            _fields(result)
            assert result["jobs"] > 0 and result["avg_jct_s"] > 0
        assert "avg_jct_gavel_over_shoal" in run["ratios"]
        assert "makespan_lower_than_gavel" in run["ratios"]


@pytest.mark.parametrize("pods", ["default", "gpuspec33", "multigpu50"])
def test_openb_pod_lists_against_best_fit(capsys: pytest.CaptureFixture[str], pods: str) -> None:
    doc = _run(
        capsys,
        "--trace", str(FIXTURES / "openb" / f"openb_pod_list_{pods}.csv"),
        "--nodes", str(FIXTURES / "openb" / "openb_node_list_gpu_node.csv"),
        "--policy", "all",
    )  # fmt: skip
    (run,) = doc["runs"]
    assert [r["policy"] for r in run["results"]] == ["fifo", "bestfit", "shoal"]
    for result in run["results"]:
        _fields(result)
        assert 0.0 <= result["unallocated_gpu_fraction"] <= 1.0
        assert result["pods_arrived"] > 0
    assert "unallocated_fewer_than_bestfit" in run["ratios"]


def test_a_generic_jobs_csv(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _run(
        capsys, "--trace", str(FIXTURES / "sched" / "jobs.csv"), "--policy", "fifo,shoal",
        "--cluster", "v100:8,k80:8", "--window", "0:1",
    )  # fmt: skip
    (run,) = doc["runs"]
    for result in run["results"]:
        _fields(result)
        assert result["jobs"] == 6
        assert result["makespan_s"] is not None


@pytest.mark.parametrize("costs", ["same", "paper"])
def test_gavel_under_either_costs(capsys: pytest.CaptureFixture[str], costs: str) -> None:
    doc = _run(
        capsys, "--trace", "gavel-synthetic", "--cluster", "v100:8,p100:8,k80:8",
        "--load", "8", "--jobs", "40", "--policy", "gavel", "--seed", "3", "--costs", costs,
    )  # fmt: skip
    assert doc["costs"] == costs
    (result,) = doc["runs"][0]["results"]
    _fields(result)
    for key in ("preemptions", "moves", "lost_gpu_s"):
        assert key in result
    assert (result["lost_gpu_s"] == 0.0) == (costs == "paper")


def test_no_ratio_against_a_policy_that_left_measured_jobs_unfinished() -> None:
    from bench.sched.metrics import ratios

    shoal = {"policy": "shoal", "avg_jct_s": 100.0, "p99_jct_s": 300.0, "makespan_s": 900.0}
    gavel = {"policy": "gavel", "avg_jct_s": 10.0, "p99_jct_s": 20.0, "makespan_s": None}
    fifo = {"policy": "fifo", "avg_jct_s": 400.0, "p99_jct_s": 600.0, "makespan_s": 1800.0}
    out = ratios([shoal, {**gavel, "jobs_unfinished": 247}, {**fifo, "jobs_unfinished": 0}])
    assert out["avg_jct_gavel_over_shoal"] is None  # its 3 finished jobs say nothing
    assert out["p99_jct_lower_than_gavel"] is None
    assert out["avg_jct_fifo_over_shoal"] == 4.0
    assert out["p99_jct_lower_than_fifo"] == 0.5


TEAM_FIELDS = (
    "team_guarantee_wait_s_max", "jain_fairness", "quota_overshoot_gpus_max",
    "quota_overshoot_s_max",
)  # fmt: skip


def test_teams_emit_the_bars_fields_and_shoal_keeps_each_team_under_its_maximum(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = _run(
        capsys, "--trace", "gavel-synthetic", "--cluster", "v100:8,p100:8,k80:8",
        "--load", "8", "--jobs", "60", "--policy", "fifo,shoal", "--seed", "3", "--teams", "4",
    )  # fmt: skip
    assert doc["teams"] == 4
    by_policy = {r["policy"]: r for r in doc["runs"][0]["results"]}
    for result in by_policy.values():
        _fields(result)
        for key in TEAM_FIELDS:
            assert key in result, key
    # first fit knows no quotas: a team takes more than twice its quarter of the 24 GPUs
    assert by_policy["fifo"]["quota_overshoot_gpus_max"] > 0
    assert by_policy["shoal"]["quota_overshoot_gpus_max"] == 0


def _overshoot(capsys: pytest.CaptureFixture[str], *extra: str) -> float:
    doc = _run(
        capsys, "--trace", "gavel-synthetic", "--cluster", "v100:16,p100:16,k80:16",
        "--load", "8", "--jobs", "120", "--policy", "shoal", "--seed", "4", "--teams", "4",
        "--team-max", "1.25", *extra,
    )  # fmt: skip
    (result,) = doc["runs"][0]["results"]
    return float(result["quota_overshoot_gpus_max"])


def test_owners_whose_views_differ_overshoot_a_maximum_that_a_quota_desk_holds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Half of the owners deciding from a view 30 s older each start a team's job that fits
    under its maximum as they see it: together they pass it. Counting every start, as the
    team's desk does, none passes it."""
    assert _overshoot(capsys) == 0
    assert _overshoot(capsys, "--view-lag", "30") > 0
    assert _overshoot(capsys, "--view-lag", "30", "--desk") == 0


def test_openb_the_policy_is_told_the_whole_lists_shapes_from_the_first_pod() -> None:
    """``--workload list``: FGD's target workload, every GPU pod shape of the list weighed by
    how many pods have it (with the GPU models a pod accepts), from the first decision on;
    ``arrived``: only the shapes of the pods arrived so far."""
    from agent.policy.fragmentation import Shape
    from agent.policy.snapshot import Snapshot
    from bench.sched.cluster import nodes_from_openb
    from bench.sched.engine import Simulation
    from bench.sched.simtypes import Plan, SimConfig
    from bench.sched.traces import openb, openb_shapes, shape_of
    from bench.sched.truth import Truth

    pods = FIXTURES / "openb" / "openb_pod_list_gpuspec33.csv"
    nodes = nodes_from_openb(FIXTURES / "openb" / "openb_node_list_gpu_node.csv")
    jobs = openb(pods, 1, fill=0.5, capacity_gpus=sum(n.gpus for n in nodes), interval_s=1.0)
    shapes = openb_shapes(pods)
    with pods.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["num_gpu"]) > 0]
    gpu_pods = [
        Shape(
            int(r["num_gpu"]),
            min(1.0, int(r["gpu_milli"]) / 1000),
            int(r["cpu_milli"]),
            models=tuple(m for m in r["gpu_spec"].split("|") if m),
        )
        for r in rows
    ]
    assert sum(s.weight for s in shapes) == len(gpu_pods)
    assert {(s.gpus, s.fraction, s.cpu_milli, s.models) for s in shapes} == {
        (s.gpus, s.fraction, s.cpu_milli, s.models) for s in gpu_pods
    }
    assert any(s.models for s in shapes)

    class Told:
        name = "told"

        def __init__(self) -> None:
            self.seen: list[Snapshot] = []

        def plan(self, snapshot: Snapshot, sim: Simulation) -> Plan:
            self.seen.append(snapshot)
            return Plan()

    for config, first in (
        (SimConfig(fill=True, shapes=shapes), shapes),
        (SimConfig(fill=True), None),
    ):
        told = Told()
        Simulation(nodes, jobs, told, Truth(0.0, 1), config).run()
        assert told.seen[0].shapes == (first or (shape_of(jobs[0]),))


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("--desk",), "--desk and --team-max go with --teams"),
        (("--team-max", "1.5"), "--desk and --team-max go with --teams"),
        (("--teams", "4", "--team-max", "0.5"), "--team-max must be at least 1"),
        (("--workload", "arrived"), "--workload goes with an openb pod list"),
        (("--view-lag", "-1"), "--view-lag must not be negative"),
        (("--view-lag", "5", "--owners", "1"), "lags half of the shoal policy's owners"),
        (("--policy", "fifo", "--view-lag", "5"), "lags half of the shoal policy's owners"),
    ],
)
def test_an_option_the_run_would_not_use_is_refused(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], why: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--trace", "gavel-synthetic", "--jobs", "10", "--policy", "shoal", *args])
    assert exit_.value.code == 2
    assert why in capsys.readouterr().err
