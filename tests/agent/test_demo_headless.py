"""``shoal demo --headless --json`` at a tiny size: real agents, a real workload, every field
BENCHMARKS.md names (the figures themselves come from full-size runs, not from here)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from agent.cli.demo import schedule

FIELDS = (
    "nodes",
    "converged_s",
    "jobs_submitted",
    "jobs_succeeded",
    "jobs_failed",
    "jobs_lost",
    "submit_to_running_ms_p50",
    "submit_to_running_ms_p99",
    "agent_rss_mb_max",
    "agent_cpu_pct_mean",
    "agent_idle_rss_mb_mean",
    "agent_idle_cpu_pct_mean",
)
TINY = ("--nodes", "3", "--duration", "3", "--rate", "2", "--idle", "2")


def _headless(*args: str, timeout_s: float) -> dict[str, Any]:
    """The figures of ``shoal demo --headless --json ARGS``, run through the real CLI."""
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--headless", "--json", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


@pytest.mark.slow
def test_headless_demo_runs_a_workload_and_prints_the_figures() -> None:
    figures = _headless(*TINY, timeout_s=180)
    assert all(field in figures for field in FIELDS), figures
    assert figures["nodes"] == 3
    assert figures["jobs_submitted"] >= 4
    assert figures["jobs_succeeded"] == figures["jobs_submitted"]
    assert figures["jobs_lost"] == 0
    assert 0 < figures["submit_to_running_ms_p50"] <= figures["submit_to_running_ms_p99"]
    assert figures["agent_idle_rss_mb_mean"] > 10
    assert figures["agent_idle_cpu_pct_mean"] is not None


POLICY_FIELDS = (
    "policy",
    "avg_jct_s",
    "p99_jct_s",
    "deadline_misses",
    "preemptions",
    "migrations",
    "jobs_run_twice_concurrently",
    "jobs_by_model",
    "avg_queue_s",
    "offers_started",
    "offers_declined",
)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fifo", "shoal"])
def test_the_placement_workload_runs_under_either_policy(policy: str) -> None:
    """The same seeded synthetic jobs, on two hosts (P100s, V100s): every field, nothing lost,
    no job run twice at once. Which policy does better is measured at full size."""
    tiny = ("--nodes", "2", "--duration", "4", "--rate", "1", "--idle", "2")
    figures = _headless("--policy", policy, *tiny, timeout_s=300)
    assert all(field in figures for field in FIELDS + POLICY_FIELDS), figures
    assert figures["policy"] == policy
    assert figures["jobs_submitted"] >= 1
    assert figures["jobs_lost"] == 0 and figures["jobs_unfinished"] == 0
    assert figures["jobs_succeeded"] == figures["jobs_submitted"], figures
    assert figures["jobs_run_twice_concurrently"] == 0
    assert figures["avg_jct_s"] > 0 and figures["p99_jct_s"] >= figures["avg_jct_s"]
    assert sum(figures["jobs_by_model"].values()) == figures["jobs_submitted"]
    assert figures["offers_started"] >= figures["jobs_submitted"]
    assert set(figures["jobs_by_model"]) <= {"p100", "v100"}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--idle", "-1"), "--idle must not be negative"),
        (("--policy", "gavel"), "invalid choice: 'gavel'"),
    ],
)
def test_a_typo_in_demo_options_is_one_line(args: tuple[str, ...], said: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--headless", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert said in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_one_seed_schedules_the_same_submissions_however_long_they_take() -> None:
    arrivals = schedule(5, 60.0, 1.0, 8)
    assert arrivals == schedule(5, 60.0, 1.0, 8)
    assert arrivals != schedule(6, 60.0, 1.0, 8)
    assert 30 <= len(arrivals) <= 100  # about 60
    assert arrivals[0].offset_s == 0.0 and all(a.offset_s < 60.0 for a in arrivals)
    assert [a.offset_s for a in arrivals] == sorted(a.offset_s for a in arrivals)
    assert {a.agent for a in arrivals} == set(range(8))
