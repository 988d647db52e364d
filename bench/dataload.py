"""The data benchmark's workload and its figures, sans I/O: what ``python -m bench.data`` runs
and how it reads what happened.

:func:`draw` makes the seeded workload: a few datasets (sizes log-uniform between
:data:`MIN_DATASET_BYTES` and :data:`MAX_DATASET_BYTES`, times ``scale``), each held at first by
one or two hosts, popular by a Zipf law over a seeded order, and jobs arriving as a Poisson
stream, each naming one dataset (drawn by popularity) and computing for a few seconds once it has
read it whole. :func:`mode_figures` turns the jobs' records (their owners' listing) and their
own ledger lines (``bench/datajob.py``) into one mode's figures.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

MIN_DATASET_BYTES: Final = 300 << 20
MAX_DATASET_BYTES: Final = 3 << 30
FILES_PER_DATASET: Final = (2, 6)
ZIPF_S: Final = 1.1
COMPUTE_S: Final = (2.0, 5.0)
MODE_FIELDS: Final[tuple[str, ...]] = (
    "data_wait_s_p50",
    "data_wait_s_p99",
    "bytes_on_network",
    "bytes_minimum",
    "cache_hit_rate",
    "avg_jct_s",
    "jobs",
    "jobs_lost",
)
"""The contract's fields of each mode's object."""
HIT_WAIT_S: Final = 0.5
"""A job whose data was ready within this of its slot freeing found it there: a hit."""


@dataclass(frozen=True, slots=True)
class DatasetPlan:
    name: str
    file_bytes: tuple[int, ...]
    holders: tuple[int, ...]
    """Host indexes holding it at the start."""
    popularity: float

    @property
    def total_bytes(self) -> int:
        return sum(self.file_bytes)


@dataclass(frozen=True, slots=True)
class JobPlan:
    index: int
    at_s: float
    """When it is submitted, from the start of the mode."""
    dataset: str
    compute_s: float


@dataclass(frozen=True, slots=True)
class Workload:
    seed: int
    hosts: int
    datasets: tuple[DatasetPlan, ...]
    jobs: tuple[JobPlan, ...]

    def dataset(self, name: str) -> DatasetPlan:
        return next(d for d in self.datasets if d.name == name)


def draw(
    seed: int, *, hosts: int, datasets: int, jobs: int, scale: float, window_s: float
) -> Workload:
    """The workload of ``seed``: the same for every mode of a run."""
    if hosts < 2 or datasets < 1 or jobs < 1 or scale <= 0 or window_s < 0:
        raise ValueError("hosts >= 2, datasets >= 1, jobs >= 1, scale > 0, window_s >= 0")
    rng = random.Random(seed)
    ranks = list(range(datasets))
    rng.shuffle(ranks)
    weights = [1.0 / (r + 1) ** ZIPF_S for r in ranks]
    total_weight = sum(weights)
    plans = []
    for i in range(datasets):
        size = math.exp(rng.uniform(math.log(MIN_DATASET_BYTES), math.log(MAX_DATASET_BYTES)))
        size = max(1 << 20, int(size * scale))
        files = rng.randint(*FILES_PER_DATASET)
        # as shares of the size, so --scale changes the sizes and nothing else a seed draws
        cuts = sorted({min(size - 1, max(1, int(rng.random() * size))) for _ in range(files - 1)})
        sizes = tuple(b - a for a, b in zip([0, *cuts], [*cuts, size], strict=True))
        held = rng.sample(range(hosts), 1 if hosts < 4 or rng.random() < 0.5 else 2)
        plans.append(DatasetPlan(f"ds{i}", sizes, tuple(sorted(held)), weights[i] / total_weight))
    names = [p.name for p in plans]
    popularity = [p.popularity for p in plans]
    at_s = 0.0
    rate = jobs / window_s if window_s > 0 else math.inf
    job_plans = []
    for j in range(jobs):
        job_plans.append(
            JobPlan(j, round(at_s, 3), rng.choices(names, popularity)[0], rng.uniform(*COMPUTE_S))
        )
        if rate != math.inf:
            at_s += rng.expovariate(rate)
    return Workload(seed, hosts, tuple(plans), tuple(job_plans))


# -- the figures -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """One job as its record and its last attempt's ledger lines tell it."""

    job_id: str
    dataset: str
    state: str
    runner: int | None
    """Host index of the last attempt's runner."""
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    ready_at: float | None
    """When the job's data was ready (its ledger's ``ready`` line)."""
    verified: bool | None
    """Its hash of everything it read matched (``None``: it never got that far)."""


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1), nearest rank; ``None`` of nothing."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def data_waits(outcomes: Iterable[JobOutcome]) -> dict[str, float]:
    """Each job's data wait: from its slot freeing (the end of the previous job on its runner,
    or its submission when the runner was free) until its data was ready."""
    ran = [o for o in outcomes if o.runner is not None and o.ready_at is not None]
    waits = {}
    for o in ran:
        assert o.ready_at is not None
        start = o.started_at if o.started_at is not None else o.ready_at
        freed = [
            p.finished_at
            for p in ran
            if p is not o
            and p.runner == o.runner
            and p.finished_at is not None
            and p.finished_at <= start
        ]
        since = max([o.submitted_at, *freed])
        waits[o.job_id] = max(0.0, o.ready_at - since)
    return waits


def bytes_minimum(workload: Workload, outcomes: Iterable[JobOutcome]) -> int:
    """Each dataset once per node that ran a job reading it and did not hold it at the start."""
    pairs = {(o.dataset, o.runner) for o in outcomes if o.runner is not None}
    return sum(
        workload.dataset(name).total_bytes
        for name, runner in pairs
        if runner not in workload.dataset(name).holders
    )


def mode_figures(
    workload: Workload,
    outcomes: Sequence[JobOutcome],
    bytes_on_network: int,
    submitted: int,
) -> dict[str, Any]:
    """One mode's object: the contract's fields, then how they were reached."""
    waits = data_waits(outcomes)
    done = [o for o in outcomes if o.state == "succeeded" and o.verified]
    jcts = [o.finished_at - o.submitted_at for o in done if o.finished_at is not None]
    minimum = bytes_minimum(workload, outcomes)
    hits = sum(1 for w in waits.values() if w <= HIT_WAIT_S)
    return {
        "data_wait_s_p50": _round(percentile(list(waits.values()), 0.5)),
        "data_wait_s_p99": _round(percentile(list(waits.values()), 0.99)),
        "bytes_on_network": bytes_on_network,
        "bytes_minimum": minimum,
        "bytes_ratio": round(bytes_on_network / minimum, 3) if minimum else None,
        "cache_hit_rate": round(hits / len(waits), 3) if waits else None,
        "avg_jct_s": _round(sum(jcts) / len(jcts) if jcts else None),
        "jobs": submitted,
        "jobs_succeeded": len(done),
        "jobs_lost": submitted - len(done),
        "jobs_on_bad_copy": sum(1 for o in outcomes if o.verified is False),
        "data_wait_s_mean": _round(sum(waits.values()) / len(waits) if waits else None),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def holders_of(workload: Workload) -> Mapping[str, tuple[int, ...]]:
    return {d.name: d.holders for d in workload.datasets}
