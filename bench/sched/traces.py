"""Workloads: Gavel's synthetic distribution, Alibaba's openb pod lists, and a generic jobs CSV.

A trace job carries what the simulator needs to run it (its work in its class's steps, its true
speed through :mod:`bench.sched.truth`) and what a scheduler is told (class, GPUs, constraints,
priority). Its work is never shown to a policy: the policies learn durations from the jobs that
finish and from the progress running jobs report.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from agent.policy.fragmentation import Shape
from agent.policy.gavel import gavel_matrix
from bench.sched.truth import Truth

DISTRIBUTED = ("ResNet-18", "ResNet-50", "Transformer", "LM")
"""Gavel's job templates that run on several GPUs (``distributed=True`` in its job table)."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    index: int
    arrival_s: float
    job_class: str
    gpus: int
    """GPUs per node (a share counts as one)."""
    nodes: int = 1
    fraction: float | None = None
    """A share of one GPU (openb's ``gpu_milli`` / 1000)."""
    models: tuple[str, ...] = ()
    cpu_milli: int = 0
    host_mem_bytes: int = 0
    work: float = math.inf
    """Steps of its class to run; infinite: it never ends (openb's fill experiment)."""
    kind: str = "training"
    priority: int = 0
    preemptible: bool = True
    deadline_s: float | None = None
    team: str = ""
    user: str = ""


def _scale_factor(rng: random.Random) -> int:
    """Gavel's sample of a job's GPU count (from the Philly trace)."""
    r = rng.uniform(0, 1)
    if 0.7 <= r <= 0.8:
        return 2
    if 0.8 <= r <= 0.95:
        return 4
    if r >= 0.95:
        return 8
    return 1


def _duration_s(rng: random.Random) -> float:
    """Gavel's sample of a job's duration on one V100 (from the Philly trace)."""
    if rng.random() >= 0.8:
        return 60 * 10 ** rng.uniform(3, 4)
    return 60 * 10 ** rng.uniform(1.5, 3)


def _pick_class(rng: random.Random, scale: int) -> str:
    models = gavel_matrix().models
    while True:
        model = rng.choice(models)
        if scale == 1 or model.startswith(DISTRIBUTED):
            return model


def gavel_synthetic(
    n: int,
    jobs_per_hour: float,
    seed: int,
    *,
    multi_gpu: bool,
    gpus_per_node: int,
    priorities: bool = False,
    teams: int = 0,
) -> list[TraceJob]:
    """Gavel's continuous trace: Poisson arrivals, Philly durations and GPU counts, a model drawn
    from Gavel's 26 (``utils.generate_job`` in Gavel, written here from its description). With
    ``teams``, each job is drawn a team (``team0``...) and one of its three users, uniformly, by
    a generator of its own (the jobs are the same with or without teams)."""
    rng = random.Random(seed)
    matrix = gavel_matrix()
    out: list[TraceJob] = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(jobs_per_hour / 3600.0) if i else 0.0
        scale = _scale_factor(rng) if multi_gpu else 1
        duration = _duration_s(rng)
        job_class = _pick_class(rng, scale)
        rate = matrix.steps_per_s(job_class, "v100", scale)
        assert rate is not None
        priority = 1 if priorities and rng.random() < 0.2 else 0
        nodes = max(1, math.ceil(scale / gpus_per_node))
        out.append(
            TraceJob(
                i,
                t,
                job_class,
                scale // nodes,
                nodes,
                work=duration * rate,
                priority=priority,
            )
        )
    if teams > 0:
        draw = random.Random(f"teams/{seed}")
        for i, job in enumerate(out):
            k = draw.randrange(teams)
            out[i] = replace(job, team=f"team{k}", user=f"team{k}-user{draw.randrange(3)}")
    return out


WORKLOAD_SHAPES = 24
"""Task shapes told to the policy, at most: the most common (of openb's default list, these 24
are 91% of its GPU pods)."""


def top_shapes(counts: dict[Shape, float], limit: int = WORKLOAD_SHAPES) -> tuple[Shape, ...]:
    """The ``limit`` most common of ``counts`` (shapes of weight 1 -> how many), weighed by
    count."""
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
    return tuple(Shape(s.gpus, s.fraction, s.cpu_milli, w, s.models) for s, w in top)


def shape_of(job: TraceJob) -> Shape:
    """A trace job's task shape (of weight 1), as fragmentation reads it."""
    fraction = job.fraction if job.fraction is not None else 1.0
    return Shape(job.gpus, fraction, job.cpu_milli, models=job.models)


def openb_shapes(path: Path) -> tuple[Shape, ...]:
    """The shapes of an openb pod list's GPU pods (:func:`top_shapes`): FGD's "target
    workload", which its scheduler is told from the whole list before the first pod arrives."""
    counts: dict[Shape, float] = {}
    for pod in _openb_pods(path):
        if pod.gpus > 0:
            shape = shape_of(pod)
            counts[shape] = counts.get(shape, 0.0) + 1.0
    return top_shapes(counts)


def _openb_pods(path: Path) -> list[TraceJob]:
    pods: list[TraceJob] = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            num = int(row["num_gpu"])
            milli = int(row["gpu_milli"])
            spec = row.get("gpu_spec") or ""
            models = tuple(dict.fromkeys(m for m in spec.split("|") if m))
            fraction = milli / 1000.0 if num == 1 and milli < 1000 else None
            pods.append(
                TraceJob(
                    0,
                    0.0,
                    "",
                    num,
                    fraction=fraction,
                    models=models,
                    cpu_milli=int(row["cpu_milli"]),
                    host_mem_bytes=int(row["memory_mib"]) * 1024**2,
                    kind="inference" if row.get("qos", "LS") != "BE" else "batch",
                    preemptible=False,
                )
            )
    return pods


def openb(
    path: Path, seed: int, *, fill: float, capacity_gpus: float, interval_s: float
) -> list[TraceJob]:
    """openb pods in a seeded random order, drawn again from the list until the GPUs they ask
    for reach ``fill`` times the cluster's (FGD's "inflation"); none of them ever ends."""
    pods = _openb_pods(path)
    rng = random.Random(seed)
    order = list(range(len(pods)))
    rng.shuffle(order)
    out: list[TraceJob] = []
    asked = 0.0
    k = 0
    while asked < fill * capacity_gpus and pods:
        if k and k % len(order) == 0:
            rng.shuffle(order)
        pod = pods[order[k % len(order)]]
        asked += pod.fraction if pod.fraction is not None else pod.gpus
        out.append(_renumber(pod, len(out), len(out) * interval_s))
        k += 1
    return out


def _renumber(job: TraceJob, index: int, arrival_s: float) -> TraceJob:
    from dataclasses import replace

    return replace(job, index=index, arrival_s=arrival_s)


def generic_csv(
    path: Path, seed: int, truth: Truth, types: Sequence[str], gpus_per_node: int
) -> list[TraceJob]:
    """``submit_time,duration_s,num_gpus[,gpu_type][,model]``: ``duration_s`` is the runtime on
    the fastest type of the cluster; a job without a model gets one drawn (seeded) from Gavel's
    distribution; ``gpu_type``, when given, is the only type it accepts."""
    rng = random.Random(seed)
    out: list[TraceJob] = []
    with path.open(newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: float(r["submit_time"]))
    for i, row in enumerate(rows):
        gpus = int(row["num_gpus"])
        model = (row.get("model") or "").strip()
        job_class = model or _pick_class(rng, gpus if gpus in (1, 2, 4, 8) else 1)
        nodes = max(1, math.ceil(gpus / gpus_per_node))
        per_node = max(1, gpus // nodes) if gpus else 0
        wanted = (row.get("gpu_type") or "").strip()
        allowed = (wanted,) if wanted else tuple(types)
        fastest = max(truth.rate(job_class, t, max(gpus, 1), nodes == 1) for t in allowed)
        out.append(
            TraceJob(
                i,
                float(row["submit_time"]),
                job_class,
                per_node,
                nodes,
                models=(wanted,) if wanted else (),
                work=float(row["duration_s"]) * fastest,
            )
        )
    return out
