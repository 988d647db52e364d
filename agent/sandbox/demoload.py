"""The placement workload of ``shoal demo --headless --policy fifo|shoal``: seeded synthetic jobs
whose speed follows the device they get, and the figures that say how well they were placed.

Each job runs :mod:`agent.sandbox.synthjob` with a class from Gavel's matrix (training: ResNet-50,
Transformer, LM, CycleGAN, A3C; inference: ResNet-18, Recommendation), so it runs as fast on the
device it was given as the policy's throughput model says the real thing would. The jobs declare
their class in the ``class`` label (what :func:`agent.policy.adapt.job_class` reads) and their
kind in the spec. The mix: 1, 2 or 4 GPUs; some need CUDA or ROCm; a fifth at a higher priority;
a third with a deadline of 1.2x their time on the reference device (met on a fast device, missed
on a slow one, or after a long wait); the ResNet classes read ``imagenet`` and the language models
``wikitext``, which some demo hosts hold (:func:`lay_out_datasets`, small sparse files): a job
placed on a host without its dataset waits while the host stages it from a holder, so the policy
weighs where the data is. Work is scaled so a job takes 1 to 10 s on
the fastest device of the demo's fleet (:data:`FLEET`) and up to about two minutes on the
slowest: a run stays short.

Gangs, shares and preemption are in the mix too: a fifth of the 4-GPU training jobs run as a gang
of 2 nodes x 2 GPUs, half the 1-GPU inference jobs take half a GPU (a share), and half the jobs of
the lower priority are preemptible (the demo's agents let a job be preempted after
:data:`PREEMPT_MIN_RUN_S`), so a job of the higher priority may take their GPUs.

The figures (:func:`placement_figures`) come from the jobs as the mesh lists them: job completion
time from the client's submission to the owner's ``finished_at`` (and the part of it spent before
the last attempt started), deadline misses, preemptions and
migrations (attempts that ended so), attempts of one job that overlapped in time (there must be
none), and where the jobs ran (the model of each job's devices); and from the agents' metrics,
the offers runners started and declined (a decline: the owner's view of the runner's free devices
was out of date, and the job went on to its next candidate).
"""

from __future__ import annotations

import itertools
import math
import random
import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

from agent.job.jobspec import BackendName, JobKind, JobSpec, Resources
from agent.sandbox.jobpython import HERE, JobPython

CLASSES: Final[tuple[tuple[str, JobKind], ...]] = (
    ("ResNet-50 (batch size 64)", "training"),
    ("Transformer (batch size 128)", "training"),
    ("LM (batch size 20)", "training"),
    ("CycleGAN", "training"),
    ("A3C", "training"),
    ("ResNet-18 (batch size 16)", "inference"),
    ("Recommendation (batch size 1024)", "inference"),
)
"""Job classes, Gavel's model names, with the kind each runs as."""

DATASET_OF: Final[Mapping[str, str]] = {
    "ResNet-50 (batch size 64)": "imagenet",
    "ResNet-18 (batch size 16)": "imagenet",
    "Transformer (batch size 128)": "wikitext",
    "LM (batch size 20)": "wikitext",
}
FLEET: Final[tuple[str, ...]] = (
    "p100:4",
    "v100:4",
    "l4:4",
    "linux-arm64-rx7900",
    "a100-80gb:4",
    "h100:4",
    "mi300x:4",
    "windows-arc-a770",
)
"""The hosts of the placement demo (``--nodes`` cycles through them): eight generations of GPU,
four of each but the Arc A770 (29 in all), as a lab that bought some every year has; Gavel's
P100 and V100, whose speeds are Gavel's measurements. Fast GPUs are a minority, as they are in
such a fleet: what first fit lands on depends on the order of node ids, what the policy picks
does not."""
HOST_DATASETS: Final[Mapping[int, Mapping[str, int]]] = {
    1: {"imagenet": 48 << 20},
    5: {"imagenet": 48 << 20},
    3: {"wikitext": 16 << 20},
    6: {"wikitext": 16 << 20},
}
"""Demo agent index -> datasets it holds, with their sizes in bytes; in a smaller demo the
index wraps around its hosts, so every dataset has a holder. Small enough that a job placed away
from its data stages it in seconds: the jobs of a demo run short."""

WORK_S: Final = (15.0, 60.0)
"""Work of a job, reference seconds (a V100's), drawn log-uniformly."""
DEADLINE_SLACK: Final = 1.2
"""A deadline is this many times the job's work after its submission."""
SETTLE_S: Final = 300.0
"""How long the demo waits, after the last submission, for every job to end."""


class DemoJob(NamedTuple):
    """One job of the workload, before it becomes a spec."""

    job_class: str
    kind: JobKind
    gpus: int
    """GPUs on each node (a share: 1, the GPU it shares)."""
    work_s: float
    priority: int
    deadline_in_s: float | None
    datasets: tuple[str, ...]
    backends: tuple[BackendName, ...]
    nodes: int = 1
    share: float | None = None
    """A share of one GPU, as a fraction of it."""
    preemptible: bool = False


PREEMPT_MIN_RUN_S: Final = 15.0
"""The placement demo's agents let a preemptible job be preempted after this long (a run lasts a
minute or two; the agents' default, ten minutes, would never let one be)."""


def draw_job(rng: random.Random) -> DemoJob:
    """The next job of the seeded mix (see the module doc)."""
    job_class, kind = rng.choice(CLASSES)
    gpus = rng.choices((1, 2, 4), weights=(55, 30, 15))[0]
    lo, hi = WORK_S
    work_s = round(math.exp(rng.uniform(math.log(lo), math.log(hi))), 1)
    priority = 1 if rng.random() < 0.2 else 0
    deadline = round(DEADLINE_SLACK * work_s, 1) if rng.random() < 1 / 3 else None
    dataset = DATASET_OF.get(job_class)
    backends: tuple[BackendName, ...] = ()
    if kind == "training" and rng.random() < 0.3:
        backends = ("cuda", "rocm")
    nodes, share = 1, None
    if kind == "training" and gpus == 4 and rng.random() < 0.2:
        nodes, gpus = 2, 2  # a gang: 2 nodes x 2 GPUs
    elif kind == "inference" and gpus == 1 and rng.random() < 0.5:
        share = 0.5
    preemptible = priority == 0 and rng.random() < 0.5
    datasets = (dataset,) if dataset else ()
    return DemoJob(
        job_class, kind, gpus, work_s, priority, deadline, datasets, backends, nodes, share,
        preemptible,
    )  # fmt: skip


def job_spec(job: DemoJob, now: float, python: JobPython = HERE) -> JobSpec:
    """The spec submitted for ``job`` at ``now`` (epoch seconds), run by ``python``."""
    command = (
        python.executable,
        "-m",
        "agent.sandbox.synthjob",
        "--class",
        job.job_class,
        "--kind",
        job.kind,
        "--work-s",
        str(job.work_s),
    )
    return JobSpec(
        command=command,
        kind=job.kind,
        resources=Resources(
            gpus_per_node=job.gpus,
            nodes=job.nodes,
            backends=job.backends,
            share_fraction=job.share,
        ),
        priority=job.priority,
        preemptible=job.preemptible,
        deadline=None if job.deadline_in_s is None else now + job.deadline_in_s,
        datasets=job.datasets,
        labels={"class": job.job_class, "demo": "placement"},
        env=dict(python.env),
        max_runtime_s=600,
    )


def lay_out_datasets(datasets_dirs: Sequence[Path]) -> None:
    """The datasets :data:`HOST_DATASETS` gives each demo host (its index wrapped around the
    hosts there are): sparse files of their size, so the disk does not hold them."""
    if not datasets_dirs:
        return
    for index, held in HOST_DATASETS.items():
        folder = datasets_dirs[index % len(datasets_dirs)]
        folder.mkdir(parents=True, exist_ok=True)
        for name, size in held.items():
            with (folder / name).open("wb") as f:
                f.truncate(size)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` (nearest rank); ``None`` for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _overlapping(attempts: Sequence[Mapping[str, Any]]) -> bool:
    """Two attempts of one job ran at once (an attempt still running runs until now). The
    members of one gang attempt (one entry per rank) are one attempt, from its first start to
    its last end."""
    by_attempt: dict[Any, tuple[float, float]] = {}
    for a in attempts:
        if a.get("started_at") is None:
            continue
        start = float(a["started_at"])
        end = math.inf if a.get("finished_at") is None else float(a["finished_at"])
        held = by_attempt.get(a.get("attempt"))
        by_attempt[a.get("attempt")] = (
            (start, end) if held is None else (min(held[0], start), max(held[1], end))
        )
    spans = sorted(by_attempt.values())
    return any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))


def placement_figures(
    jobs: Mapping[str, Mapping[str, Any]],
    submitted_at: Mapping[str, float],
    deadlines: Mapping[str, float],
    device_models: Mapping[tuple[str, str], str],
) -> dict[str, Any]:
    """The placement figures of a run: ``jobs`` as the mesh lists them by id, when each was
    submitted, the deadlines, and the model of each ``(node id, device key)``."""
    jct = [
        float(j["finished_at"]) - submitted_at[jid]
        for jid, j in jobs.items()
        if j.get("state") == "succeeded" and j.get("finished_at") is not None
    ]
    queued = [
        float(j["started_at"]) - submitted_at[jid]
        for jid, j in jobs.items()
        if j.get("state") == "succeeded" and j.get("started_at") is not None
    ]
    misses = 0
    for jid, deadline in deadlines.items():
        finished = jobs.get(jid, {}).get("finished_at")
        if finished is None or float(finished) > deadline:
            misses += 1
    causes: Counter[str] = Counter()
    twice = 0
    ran_on: Counter[str] = Counter()
    for j in jobs.values():
        attempts = j.get("attempts") or []
        causes.update(str(a.get("cause")) for a in attempts)
        twice += _overlapping(attempts)
        models = {device_models.get((str(j.get("runner")), d), "?") for d in j.get("devices") or ()}
        if models:
            ran_on["+".join(sorted(models))] += 1
    return {
        "avg_jct_s": round(statistics.fmean(jct), 2) if jct else None,
        "p99_jct_s": None if not jct else round(percentile(jct, 0.99) or 0.0, 2),
        "avg_queue_s": round(statistics.fmean(queued), 2) if queued else None,
        "deadline_misses": misses,
        "jobs_with_deadline": len(deadlines),
        "preemptions": causes["preempt"],
        "migrations": causes["migrate"],
        "jobs_run_twice_concurrently": twice,
        "jobs_by_model": dict(sorted(ran_on.items())),
    }


_OFFERS = re.compile(r'^shoal_placements_total\{outcome="(\w+)"\} ([0-9.eE+]+)$')


def offer_counts(metrics_lines: Sequence[str]) -> Counter[str]:
    """Offers by outcome from the text of one or more agents' ``/metrics``."""
    counts: Counter[str] = Counter()
    for line in metrics_lines:
        m = _OFFERS.match(line.strip())
        if m is not None:
            counts[m.group(1)] += int(float(m.group(2)))
    return counts
