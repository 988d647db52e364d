"""The figures BENCHMARKS.md asks of ``python -m bench.sched``, from one finished run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def pct(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank), ``None`` for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100.0 * len(s)) - 1))]


@dataclass(frozen=True, slots=True)
class JobRecord:
    index: int
    arrival_s: float
    first_start_s: float | None
    finish_s: float | None
    deadline_s: float | None


def summarize(
    policy: str,
    records: Sequence[JobRecord],
    measured: set[int],
    *,
    total_gpus: int,
    busy_area: float,
    idle_waiting_area: float,
    waiting_time: float,
    decision_ms: Sequence[float],
    tick_ms: Sequence[float] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    window = [r for r in records if r.index in measured]
    done = [r for r in window if r.finish_s is not None]
    jct = [r.finish_s - r.arrival_s for r in done if r.finish_s is not None]
    delay = [r.first_start_s - r.arrival_s for r in window if r.first_start_s is not None]
    finished_all = all(r.finish_s is not None for r in records)
    first = min((r.arrival_s for r in records), default=0.0)
    last = max((r.finish_s for r in records if r.finish_s is not None), default=first)
    makespan = last - first if records else 0.0
    with_deadline = [r for r in done if r.deadline_s is not None]
    missed = [r for r in with_deadline if (r.finish_s or 0.0) > (r.deadline_s or 0.0)]
    out: dict[str, Any] = {
        "policy": policy,
        "jobs": len(done),
        "jobs_unfinished": len(window) - len(done),
        "avg_jct_s": sum(jct) / len(jct) if jct else None,
        "p50_jct_s": pct(jct, 50),
        "p99_jct_s": pct(jct, 99),
        "makespan_s": makespan if finished_all else None,
        "utilization": (
            busy_area / (total_gpus * makespan) if finished_all and makespan > 0 else None
        ),
        "queue_delay_p50_s": pct(delay, 50),
        "queue_delay_p99_s": pct(delay, 99),
        "deadline_miss_rate": len(missed) / len(with_deadline) if with_deadline else None,
        "unallocated_gpu_fraction": (
            idle_waiting_area / (total_gpus * waiting_time) if waiting_time > 0 else 0.0
        ),
        "decision_ms_p50": pct(decision_ms, 50),
        "decision_ms_p99": pct(decision_ms, 99),
        "decisions": len(decision_ms),
    }
    if tick_ms is not None:
        out["tick_ms_p50"] = pct(tick_ms, 50)
        out["tick_ms_p99"] = pct(tick_ms, 99)
    if extra:
        out.update(extra)
    return out


def ratios(results: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Shoal against the baselines, as BENCHMARKS.md states its bars."""
    by = {r["policy"]: r for r in results if "error" not in r}
    shoal = by.get("shoal")
    out: dict[str, float | None] = {}
    if shoal is None:
        return out

    def div(a: Any, b: Any) -> float | None:
        return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None

    for base in ("fifo", "backfill", "gavel"):
        other = by.get(base)
        if other is None:
            continue
        if other.get("jobs_unfinished") or shoal.get("jobs_unfinished"):
            # JCTs of the jobs that finished only: no ratio says anything fair
            for key in ("avg_jct", "p99_jct", "makespan"):
                name = (
                    f"{key}_{base}_over_shoal" if key == "avg_jct" else f"{key}_lower_than_{base}"
                )
                out[name] = None
            continue
        out[f"avg_jct_{base}_over_shoal"] = div(other["avg_jct_s"], shoal["avg_jct_s"])
        for key in ("p99_jct_s", "makespan_s"):
            ratio = div(shoal[key], other[key])
            out[f"{key[:-2]}_lower_than_{base}"] = None if ratio is None else 1.0 - ratio
    best = by.get("bestfit")
    if best is not None:
        ratio = div(shoal["unallocated_gpu_fraction"], best["unallocated_gpu_fraction"])
        out["unallocated_fewer_than_bestfit"] = None if ratio is None else 1.0 - ratio
    return out
