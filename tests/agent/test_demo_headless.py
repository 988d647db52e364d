"""``shoal demo --headless --json`` at a tiny size: real agents, a real workload, every field
BENCHMARKS.md names (the figures themselves come from full-size runs, not from here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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


@pytest.mark.slow
def test_headless_demo_runs_a_workload_and_prints_the_figures() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--headless", "--json", *TINY],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    assert all(field in figures for field in FIELDS), figures
    assert figures["nodes"] == 3
    assert figures["jobs_submitted"] >= 4
    assert figures["jobs_succeeded"] == figures["jobs_submitted"]
    assert figures["jobs_lost"] == 0
    assert 0 < figures["submit_to_running_ms_p50"] <= figures["submit_to_running_ms_p99"]
    assert figures["agent_idle_rss_mb_mean"] > 10
    assert figures["agent_idle_cpu_pct_mean"] is not None


def test_a_typo_in_demo_options_is_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--headless", "--idle", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
