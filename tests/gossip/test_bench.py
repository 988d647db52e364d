"""The gossip benchmark runs at a tiny size and emits its fields."""

from __future__ import annotations

import json

import pytest

from bench.gossip import main


def test_bench_emits_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nodes", "12", "--loss", "0.01", "--seconds", "40", "--seed", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "nodes", "loss", "dissemination_rounds_p50", "dissemination_rounds_p99",
        "dissemination_s_p99", "detect_s_p50", "detect_s_p99", "false_deaths",
        "bytes_per_node_per_s", "wall_s",
    ):  # fmt: skip
        assert key in out
    assert out["nodes"] == 12 and out["loss"] == 0.01
    assert out["dissemination_samples"] > 0 and out["crashes"] > 0
    assert out["detect_s_p50"] is not None and out["bytes_per_node_per_s"] > 0


def test_bench_partition_reports_heal(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--nodes", "16", "--seconds", "60", "--seed", "3", "--partition-s", "12"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["partition_s"] == 12.0
    assert out["partition_deaths"] > 0  # the halves did declare each other dead
    assert out["heal_s"] is not None and out["heal_s"] < 30.0
    assert out["false_deaths"] == 0
