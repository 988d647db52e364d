"""``python -m agent.sandbox.synthjob``: a synthetic job that runs as fast as the device it was
given.

The demo's placement workload (:mod:`agent.sandbox.demoload`) submits it, so that where a job runs
changes how long it takes as it would for the real thing. It reads the models of the devices
Shoal gave it (``$SHOAL_DEVICE_MODELS``, set for every job: :mod:`agent.execution.pinning`), takes
its speed there from the same throughput model the policy ranks places with
(:mod:`agent.policy.model`: Gavel's measured matrix where the class and the device are in it, else
the catalog's datasheet figures anchored on Gavel's), and sleeps ``work / speed`` in steps. After
each step it reports its progress (``SHOAL_PROGRESS``) and, at most every ``--checkpoint-every-s``,
writes the work done to ``$SHOAL_CHECKPOINT_DIR``; an attempt that resumes (``SHOAL_RESUME=1``), on
this device or another, does only the rest, at the speed of the device it resumed on.

Work is in reference seconds: seconds on the policy's reference model (a V100) with the job's
own GPU count. A job given no device runs on the CPU (the catalog's CPU figure).

    python -m agent.sandbox.synthjob --class "ResNet-50 (batch size 64)" --kind training --work-s 60
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.policy.model import ThroughputModel

MODELS_ENV = "SHOAL_DEVICE_MODELS"
CHECKPOINT_FILE = "synthjob.json"
KINDS = ("training", "inference", "batch")


@dataclass(frozen=True, slots=True)
class Plan:
    """What one attempt does: its speed where it runs, and the work left."""

    models: tuple[str, ...]
    speed: float
    """Reference seconds of work per second on these devices."""
    work_s: float
    done_s: float
    """Work done by earlier attempts (from the checkpoint)."""

    @property
    def left_s(self) -> float:
        """Wall seconds this attempt sleeps."""
        return max(0.0, self.work_s - self.done_s) / self.speed


def device_models(env: Mapping[str, str]) -> tuple[str, ...]:
    """The models of the devices Shoal gave the job, one per device; ``("cpu",)`` for none."""
    models = tuple(m for m in env.get(MODELS_ENV, "").split(",") if m)
    return models or ("cpu",)


def speed_on(job_class: str, kind: str, models: Sequence[str]) -> float:
    """Reference seconds of work per second on ``models``: the policy's own estimate for the
    class on that many GPUs of each model, the slowest where they differ."""
    throughput = ThroughputModel()
    return min(throughput.relative(job_class, kind, m, len(models)) for m in set(models))


def plan(
    job_class: str, kind: str, work_s: float, env: Mapping[str, str], done_s: float = 0.0
) -> Plan:
    models = device_models(env)
    return Plan(models, speed_on(job_class, kind, models), work_s, done_s)


def read_checkpoint(env: Mapping[str, str]) -> float:
    """Work done by an earlier attempt when this one resumes, else 0."""
    folder = env.get("SHOAL_CHECKPOINT_DIR")
    if env.get("SHOAL_RESUME") != "1" or not folder:
        return 0.0
    try:
        done = json.loads((Path(folder) / CHECKPOINT_FILE).read_text())["done_s"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0
    return float(done) if isinstance(done, int | float) and done > 0 else 0.0


def write_checkpoint(env: Mapping[str, str], done_s: float) -> None:
    folder = env.get("SHOAL_CHECKPOINT_DIR")
    if not folder:
        return
    path = Path(folder) / CHECKPOINT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"done_s": done_s}))
    os.replace(tmp, path)


def run(p: Plan, job_class: str, steps: int, checkpoint_every_s: float) -> None:
    env = os.environ
    print(
        f"synthjob: {job_class} on {len(p.models)}x {'+'.join(sorted(set(p.models)))}: "
        f"{p.speed:.2f}x the reference, {p.done_s:.1f} of {p.work_s:.1f} s of work done, "
        f"{p.left_s:.1f} s to go",
        flush=True,
    )
    step_s = p.work_s / steps
    done = p.done_s
    last_checkpoint = time.monotonic()
    while done < p.work_s - 1e-9:
        chunk = min(step_s, p.work_s - done)
        time.sleep(chunk / p.speed)
        done += chunk
        print(f"SHOAL_PROGRESS {done / p.work_s:.4f}", flush=True)
        if time.monotonic() - last_checkpoint >= checkpoint_every_s and done < p.work_s:
            write_checkpoint(env, done)
            last_checkpoint = time.monotonic()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.sandbox.synthjob", description=__doc__)
    parser.add_argument("--class", dest="job_class", required=True, help="the job's class")
    parser.add_argument("--kind", choices=KINDS, default="training")
    parser.add_argument("--work-s", type=float, required=True, help="reference seconds of work")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checkpoint-every-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.work_s <= 0 or args.steps < 1:
        parser.error("--work-s must be positive and --steps at least 1")
    p = plan(args.job_class, args.kind, args.work_s, os.environ, read_checkpoint(os.environ))
    run(p, args.job_class, args.steps, args.checkpoint_every_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
