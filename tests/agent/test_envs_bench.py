"""``python -m bench.envs`` runs on a tiny size and emits the contract's fields (never a timed
assertion: the figures are the benchmark's, on the docs' performance page)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

FIELDS = {
    "image_cold_start_s",
    "image_prefetched_start_s",
    "env_cold_start_s",
    "env_prefetched_start_s",
    "workdir_remote_run_s",
    "container_overhead_s",
}


def test_the_bench_runs_small_and_emits_its_fields() -> None:
    argv = ["--image-mib", "4", "--workdir-mib", "1", "--workdir-files", "20", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.envs", *argv],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert set(out) >= FIELDS, out
    for key in ("env_cold_start_s", "env_prefetched_start_s", "workdir_remote_run_s"):
        assert out[key] > 0, out
    if out["image_skipped"] is None:
        assert out["image_cold_start_s"] > 0 and out["image_prefetched_start_s"] > 0, out
