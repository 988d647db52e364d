"""The data benchmark: its workload and figures (pure), its job's check, and a tiny real run in
network namespaces whose JSON has the contract's shape and figures that agree with each other."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from agent.running.datastage import env_name as runner_env_name
from bench import dataload
from bench.data import MODES, main
from bench.datajob import check, env_name
from bench.dataload import JobOutcome, Workload
from bench.netlab import tc_available
from tests.support import require_system


def test_the_workload_is_the_seeds_and_popularity_is_skewed() -> None:
    a = dataload.draw(3, hosts=5, datasets=4, jobs=40, scale=0.01, window_s=60)
    assert a == dataload.draw(3, hosts=5, datasets=4, jobs=40, scale=0.01, window_s=60)
    assert a != dataload.draw(4, hosts=5, datasets=4, jobs=40, scale=0.01, window_s=60)
    assert abs(sum(d.popularity for d in a.datasets) - 1) < 1e-9
    top = max(a.datasets, key=lambda d: d.popularity)
    assert top.popularity >= 0.4  # Zipf 1.1 over 4: the first rank holds ~48%
    for d in a.datasets:
        assert 1 <= len(d.holders) <= 2 and all(0 <= h < 5 for h in d.holders)
        assert 3 << 20 <= d.total_bytes <= 31 << 20  # 300 MB..3 GB at 1%
    assert [j.at_s for j in a.jobs] == sorted(j.at_s for j in a.jobs)
    for seed in range(1, 6):  # --scale changes the sizes, nothing else a seed draws
        small = dataload.draw(seed, hosts=5, datasets=4, jobs=40, scale=0.01, window_s=60)
        full = dataload.draw(seed, hosts=5, datasets=4, jobs=40, scale=1.0, window_s=60)
        assert full.jobs == small.jobs
        for s, f in zip(small.datasets, full.datasets, strict=True):
            assert (s.holders, len(s.file_bytes)) == (f.holders, len(f.file_bytes))
            assert abs(s.total_bytes - f.total_bytes // 100) <= 1
    assert all(dataload.COMPUTE_S[0] <= j.compute_s <= dataload.COMPUTE_S[1] for j in a.jobs)


def _outcome(job: str, runner: int, submitted: float, finished: float, ready: float) -> JobOutcome:
    return JobOutcome(job, "ds0", "succeeded", runner, submitted, ready, finished, ready, True)


def test_data_wait_counts_from_the_slot_freeing_and_the_minimum_from_where_jobs_ran() -> None:
    work = Workload(
        1,
        3,
        (dataload.DatasetPlan("ds0", (100, 50), (0,), 1.0),),
        (),
    )
    jobs = [
        _outcome("a", 1, submitted=0.0, finished=10.0, ready=2.0),  # free runner: from submit
        _outcome("b", 1, submitted=1.0, finished=20.0, ready=13.0),  # slot freed at 10
        _outcome("c", 0, submitted=5.0, finished=9.0, ready=5.1),  # on the holder
        _outcome("d", 2, submitted=5.0, finished=9.0, ready=8.0),
    ]
    waits = dataload.data_waits(jobs)
    assert waits == pytest.approx({"a": 2.0, "b": 3.0, "c": 0.1, "d": 3.0})
    assert dataload.bytes_minimum(work, jobs) == 2 * 150  # hosts 1 and 2, once each
    figures = dataload.mode_figures(work, jobs, bytes_on_network=330, submitted=5)
    assert figures["bytes_ratio"] == 1.1
    assert figures["cache_hit_rate"] == 0.25
    assert figures["jobs_lost"] == 1  # submitted, never ran
    assert figures["avg_jct_s"] == pytest.approx((10 + 19 + 4 + 4) / 4)
    assert set(dataload.MODE_FIELDS) <= set(figures)


def test_the_job_catches_a_short_or_corrupt_copy(tmp_path: Path) -> None:
    body = bytes(range(256)) * 4096
    (tmp_path / "a.bin").write_bytes(body)
    files = {"a.bin": hashlib.sha256(body).hexdigest()}
    assert check(str(tmp_path), files) == (True, len(body), "")
    (tmp_path / "a.bin").write_bytes(body[:-1])
    assert check(str(tmp_path), files)[0] is False
    (tmp_path / "a.bin").write_bytes(b"\xff" + body[1:])
    assert check(str(tmp_path), files)[2] == "a.bin: its bytes do not match"
    (tmp_path / "a.bin").unlink()
    assert check(str(tmp_path), files)[0] is False
    for name in ("image-net.v2", "ds0", "a_b"):
        assert env_name(name) == runner_env_name(name)  # the job looks where the runner says


@pytest.mark.slow
@pytest.mark.system
def test_a_tiny_run_emits_the_contract_and_its_figures_agree(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ok, why = tc_available()
    require_system(ok, why)
    args = ["--hosts", "3", "--datasets", "2", "--jobs", "4", "--scale", "0.005"]
    code = main([*args, "--window-s", "3", "--link-mbit", "100", "--seed", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(out["modes"]) == set(MODES)
    assert set(out["stage_throughput_bytes_per_s"]) == {"1", "3"}
    assert out["jobs_on_bad_copy"] == 0
    # one stream over a 100 Mbit/s token bucket: near its rate, never far past it (the bucket's
    # burst lets a short download run a little over)
    assert 0.5 * out["link_rate_bytes_per_s"] < out["link_bytes_per_s"]
    assert out["link_bytes_per_s"] < 1.5 * out["link_rate_bytes_per_s"]
    for mode, m in out["modes"].items():
        assert set(dataload.MODE_FIELDS) <= set(m), mode
        assert m["jobs"] == 4
        if "missing" in m:
            assert m["missing"] and all(m[k] is None for k in ("data_wait_s_p50", "avg_jct_s"))
            continue
        assert m["jobs_lost"] == 0, m
        # what crossed the links is at least each needed copy once
        assert m["bytes_on_network"] >= m["bytes_minimum"]
        assert m["data_wait_s_p50"] <= m["data_wait_s_p99"]
        assert 0 <= m["cache_hit_rate"] <= 1
        assert m["avg_jct_s"] >= m["data_wait_s_p50"] + dataload.COMPUTE_S[0]
        if mode == "none":
            assert m["store_hit_rate"] is None and m["agents_job_data"] == {}
        else:  # the runners counted every job: its datasets held already, or staged first
            data = m["agents_job_data"]
            assert data["hits"] + data["misses"] >= m["jobs"], data
            assert 0 <= m["store_hit_rate"] <= 1
        if mode == "stage":
            assert m["agents_job_data"].get("prefetch_started", 0) == 0  # pre-fetch is off
    none = out["modes"]["none"]
    # a job off the holders copies the whole dataset, over a link of 12.5 MB/s
    assert none["bytes_minimum"] == 0 or none["data_wait_s_p99"] > 0
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"sd{os.getpid() % 100000}-" not in left  # the lab is gone


@pytest.mark.slow
@pytest.mark.system
def test_staging_from_holders_and_the_faults_end_verified_and_run_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ok, why = tc_available()
    require_system(ok, why)
    args = ["--hosts", "5", "--datasets", "1", "--jobs", "1", "--scale", "0.002", "--modes", "none"]
    code = main(
        [*args, "--window-s", "0", "--link-mbit", "100", "--faults", "--seed", "3", "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    rates = out["stage_throughput_bytes_per_s"]
    # each holder sends at most its link's rate (its bucket's burst aside)
    assert 0 < rates["1"] < 1.5 * out["link_rate_bytes_per_s"]
    assert rates["3"] > 0
    assert [f["fault"] for f in out["faults"]] == [
        "holder_killed",
        "corrupt_holder",
        "stager_restarted",
    ]
    for fault in out["faults"]:
        assert fault["ok"], fault
        assert fault["dataset_verified"] and fault["job_runs"] == 1, fault
