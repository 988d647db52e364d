"""The demo's synthetic job: its speed is the policy's estimate for its class on the devices
Shoal gave it (``SHOAL_DEVICE_MODELS``), and it resumes from its checkpoint at the new speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.policy.model import ThroughputModel
from agent.sandbox.synthjob import device_models, plan, read_checkpoint, speed_on, write_checkpoint

RESNET = "ResNet-50 (batch size 64)"


def test_the_devices_models_come_from_the_environment_shoal_sets() -> None:
    assert device_models({"SHOAL_DEVICE_MODELS": "h100,h100"}) == ("h100", "h100")
    assert device_models({}) == ("cpu",)
    assert device_models({"SHOAL_DEVICE_MODELS": ""}) == ("cpu",)


def test_speed_is_the_policy_s_own_estimate_for_the_class_and_gpu_count() -> None:
    model = ThroughputModel()
    assert speed_on(RESNET, "training", ["h100", "h100"]) == model.relative(
        RESNET, "training", "h100", 2
    )
    # Gavel's measured matrix where the device is one of its worker types: K80 is far slower.
    assert speed_on(RESNET, "training", ["v100"]) == pytest.approx(1.0)
    assert speed_on(RESNET, "training", ["k80"]) < 0.5
    # A training job on an H100 and an inference job on an L4 behave like the real thing.
    assert speed_on(RESNET, "training", ["h100"]) > 3 * speed_on(RESNET, "training", ["l4"])
    rec = "Recommendation (batch size 1024)"
    assert speed_on(rec, "inference", ["l4"]) > speed_on(rec, "inference", ["v100"])
    # Devices of several models: the slowest sets the pace.
    mixed = speed_on(RESNET, "training", ["h100", "l4"])
    assert mixed == model.relative(RESNET, "training", "l4", 2)


def test_the_plan_sleeps_the_work_left_at_that_speed() -> None:
    env = {"SHOAL_DEVICE_MODELS": "mi300x"}
    fresh = plan(RESNET, "training", 30.0, env)
    assert fresh.left_s == pytest.approx(30.0 / fresh.speed)
    resumed = plan(RESNET, "training", 30.0, env, done_s=20.0)
    assert resumed.left_s == pytest.approx(10.0 / fresh.speed)
    assert plan(RESNET, "training", 30.0, env, done_s=31.0).left_s == 0.0


def test_a_checkpoint_is_read_only_when_the_attempt_resumes(tmp_path: Path) -> None:
    env = {"SHOAL_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    write_checkpoint(env, 12.5)
    assert read_checkpoint(env) == 0.0  # a fresh attempt starts over
    assert read_checkpoint({**env, "SHOAL_RESUME": "1"}) == 12.5
    (tmp_path / "ckpt" / "synthjob.json").write_text("not json")
    assert read_checkpoint({**env, "SHOAL_RESUME": "1"}) == 0.0
    assert read_checkpoint({"SHOAL_RESUME": "1"}) == 0.0


def _run(env: dict[str, str], *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "agent.sandbox.synthjob", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


def test_the_job_reports_progress_checkpoints_and_resumes_on_another_device(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    env = {"SHOAL_DEVICE_MODELS": "mi300x", "SHOAL_CHECKPOINT_DIR": str(ckpt)}
    common = ("--class", RESNET, "--work-s", "2", "--steps", "4", "--checkpoint-every-s", "0")
    lines = _run(env, *common)
    assert lines[0].startswith(f"synthjob: {RESNET} on 1x mi300x: 7.10x the reference")
    assert lines[1:] == [f"SHOAL_PROGRESS {f:.4f}" for f in (0.25, 0.5, 0.75, 1.0)]
    # The last step's checkpoint is not written: the job is done. The one before is.
    assert json.loads((ckpt / "synthjob.json").read_text()) == {"done_s": 1.5}
    lines = _run({**env, "SHOAL_DEVICE_MODELS": "l4", "SHOAL_RESUME": "1"}, *common)
    assert "1x l4" in lines[0] and "1.5 of 2.0 s of work done" in lines[0]
    assert lines[1:] == ["SHOAL_PROGRESS 1.0000"]
