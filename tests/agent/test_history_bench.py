"""``python -m bench.history`` runs on a tiny size and emits the fields BENCHMARKS.md lists (no
timed asserts: the figures are the benchmark's, not the test suite's)."""

from __future__ import annotations

import json
import subprocess
import sys

FIELDS = (
    "sampling_cpu_pct_of_one_core", "sampling_rss_mb", "query_24h_ms_p50", "year_bytes_8gpu",
    "rules_precision", "rules_recall", "forecast_error_at_half_p50",
)  # fmt: skip


def test_bench_history_runs_small_and_emits_the_fields() -> None:
    argv = ["--days", "2", "--seconds", "120", "--gpus", "1", "--samples", "15", "--queries", "1"]
    argv += ["--windows", "2", "--seed", "4", "--jobs", "5"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.history", *argv, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(FIELDS) <= set(out)
    assert out["sampling_cpu_pct_of_one_core"] > 0 and out["series_sampled"] > 40
    assert out["store_bytes"] > 0 and out["year_series_stored"] == 17  # 10 GPU fields, 7 host
    assert out["query_24h_raw_points"] == 86_400 and out["query_24h_raw_tier"] == 1
    assert out["year_bytes_8gpu"] is None  # not a year of 8 GPUs: not measured, and named so
    assert set(out["not_measured"]) == {"year_bytes_8gpu"}
    assert out["forecast_jobs"] == 5 and 0 <= out["forecast_error_at_half_p50"] <= 1
    assert 0 <= out["rules_precision"] <= 1 and 0 <= out["rules_recall"] <= 1
    assert out["rules_windows"] == 32  # 2 windows of each of 16 labels
