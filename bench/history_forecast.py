"""Seeded synthetic jobs with noisy progress, for the completion forecasts.

Each job runs for a drawn duration (10 minutes to 4 hours) and reports its progress every few
seconds to a minute, as real jobs do: the pace wanders (each tenth of the run goes at its own
speed, ±25 %), the job pauses now and then to write a checkpoint (a plateau of up to 2 % of the
run), the fraction it prints moves in steps (an epoch or a step counter: 20 to 1,000 of them) and
every report carries a little jitter, with an occasional wild one (a report of 1 % of them off by
up to ±0.2). The forecast is made at half-way (the true half of the run) by the agent's own
tracker (:class:`agent.execution.progress.ProgressTracker`), fed every report up to then; its
error is ``|predicted end - true end| / true duration``.

``forecast_error_at_half_p50`` is the median error over the set (bar: 15 %), ``..._p90`` its
90th percentile, ``forecast_p90_covered`` the share of jobs that ended by the p90 forecast, and
``forecast_error_at_half_window_p50`` what the old estimator (the rate over the last five
minutes' first and last report) gave on the same set.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from agent.execution.progress import ProgressTracker


@dataclass(frozen=True, slots=True)
class NoisyJob:
    duration_s: float
    reports: tuple[tuple[float, float], ...]
    """``(t_s, fraction)`` from the job's start, every report over the whole run."""


def noisy_job(rng: random.Random) -> NoisyJob:
    duration = rng.uniform(600, 4 * 3600)
    paces = [rng.uniform(0.75, 1.25) for _ in range(10)]
    total = sum(paces)
    steps = rng.choice((20, 50, 100, 1000))
    every = rng.uniform(3, 60)
    pauses = {rng.randrange(10) for _ in range(rng.randint(0, 3))}
    reports: list[tuple[float, float]] = []
    t = rng.uniform(0, every)
    while t < duration:
        # the fraction done at t: each tenth of the run's time covers its pace's share of the work
        tenth = min(9, int(t / duration * 10))
        into = t / duration * 10 - tenth
        if tenth in pauses and into > 0.8:
            into = 0.8  # writing a checkpoint: no progress for the last fifth of this tenth
        done = (sum(paces[:tenth]) + paces[tenth] * into) / total
        shown = int(done * steps) / steps + rng.gauss(0, 0.003)
        if rng.random() < 0.01:
            shown += rng.uniform(-0.2, 0.2)
        reports.append((t, min(1.0, max(0.0, shown))))
        t += every * rng.uniform(0.8, 1.2)
    return NoisyJob(duration, tuple(reports))


def _window_eta(reports: list[tuple[float, float]]) -> float | None:
    """The old estimator: the rate between the first and last report of the last five
    minutes."""
    now = reports[-1][0]
    recent = [(t, f) for t, f in reports if now - t <= 300] or reports[-2:]
    if len(recent) < 2:
        recent = reports[-2:]
    (t0, f0), (t1, f1) = recent[0], recent[-1]
    if t1 <= t0 or f1 <= f0:
        return None
    return (1 - f1) / ((f1 - f0) / (t1 - t0))


def score(seed: int, jobs: int) -> dict[str, float | None]:
    rng = random.Random(seed)
    errors: list[float] = []
    old: list[float] = []
    covered = 0
    for _ in range(jobs):
        job = noisy_job(rng)
        half = [(t, f) for t, f in job.reports if t <= job.duration_s / 2]
        tracker = ProgressTracker()
        for t, f in half:
            report = tracker.update(f, None, t)
        at = half[-1][0]
        eta, eta90 = report.eta_s, report.eta_p90_s
        errors.append(1.0 if eta is None else abs(at + eta - job.duration_s) / job.duration_s)
        covered += eta90 is not None and at + eta90 >= job.duration_s
        w = _window_eta(half)
        old.append(1.0 if w is None else abs(at + w - job.duration_s) / job.duration_s)
    errors.sort()
    return {
        "forecast_error_at_half_p50": round(statistics.median(errors), 4),
        "forecast_error_at_half_p90": round(errors[int(0.9 * (len(errors) - 1))], 4),
        "forecast_p90_covered": round(covered / jobs, 4),
        "forecast_error_at_half_window_p50": round(statistics.median(old), 4),
        "forecast_jobs": float(jobs),
    }
