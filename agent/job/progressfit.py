"""Predicted completion from a job's own progress history: a robust slope, p50 and p90 ends.

A job reports the fraction it has done (``SHOAL_PROGRESS``) now and then; the reports are noisy
(a step counter that moves in epochs, a pause to write a checkpoint, a slow batch). The slope is
Theil-Sen's: the median of the slopes between every pair of reports, which a few wild reports
cannot drag (it holds with up to 29 % of them wrong). The line goes through the median of the
reports' residuals; the job ends, at p50, where that line reaches 1.

The p90 end uses the slow end of the slope's one-sided 90 % confidence interval (Sen's:
the slope ranked :math:`(N - z_{0.9}\\sqrt{n(n-1)(2n+5)/18}) / 2` among the ``N`` pairwise slopes
of ``n`` reports), so a job with few or scattered reports gets a wide p90 and a steady one a
narrow one; never earlier than the p50, and never narrower than :data:`MIN_P90_SPREAD` of the
remaining time (the pace a job keeps wanders beyond what its reports' scatter shows).

At most :data:`MAX_POINTS` reports are fitted (the caller thins a long history: every other
report dropped when full, so the whole attempt stays covered at an even spacing); 64 reports are
2,016 pairs, well under a millisecond. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

MAX_POINTS: Final = 64
Z_90: Final = 1.2816
"""The standard normal's 90th percentile."""
MIN_P90_SPREAD: Final = 0.1
"""The p90 remaining time is at least this much longer than the p50's."""


@dataclass(frozen=True, slots=True)
class Completion:
    """When a job should end, from its progress reports."""

    rate_per_s: float
    """The robust slope: fraction per second (0 or less: no forward progress)."""
    at_s: float
    """The time of the latest report, which the remaining times count from."""
    remaining_p50_s: float | None
    """Seconds left at the p50 pace; ``None`` when the job is not moving forward."""
    remaining_p90_s: float | None
    """Seconds left at the slow (p90) pace; ``None`` when that pace is not forward."""

    @property
    def end_p50_s(self) -> float | None:
        return None if self.remaining_p50_s is None else self.at_s + self.remaining_p50_s

    @property
    def end_p90_s(self) -> float | None:
        return None if self.remaining_p90_s is None else self.at_s + self.remaining_p90_s


def theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float, list[float]] | None:
    """``(slope, intercept, sorted pairwise slopes)`` of ``(t, y)`` points; ``None`` with fewer
    than two points apart in time."""
    slopes: list[float] = []
    n = len(points)
    for i in range(n):
        ti, yi = points[i]
        for j in range(i + 1, n):
            tj, yj = points[j]
            if tj != ti:
                slopes.append((yj - yi) / (tj - ti))
    if not slopes:
        return None
    slopes.sort()
    slope = _median(slopes)
    intercept = _median([y - slope * t for t, y in points])
    return slope, intercept, slopes


def _median(values: Sequence[float]) -> float:
    """The median of ``values`` (sorted here unless already so)."""
    ordered = values if _is_sorted(values) else sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _is_sorted(values: Sequence[float]) -> bool:
    return all(values[i] <= values[i + 1] for i in range(len(values) - 1))


def slow_slope(slopes: Sequence[float], n: int) -> float:
    """The slow end of Sen's one-sided 90 % interval of the slope (``slopes`` sorted, from
    ``n`` points)."""
    count = len(slopes)
    spread = Z_90 * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    rank = max(0, min(count - 1, math.floor((count - spread) / 2)))
    return slopes[rank]


def completion(points: Sequence[tuple[float, float]]) -> Completion | None:
    """The predicted completion of a job from its progress reports ``(t_s, fraction)``, oldest
    first (at most :data:`MAX_POINTS` of them: the newest are kept); ``None`` with fewer than two
    reports apart in time."""
    pts = list(points[-MAX_POINTS:])
    fit = theil_sen(pts)
    if fit is None:
        return None
    slope, intercept, slopes = fit
    at_s, last = pts[-1]
    if last >= 1.0:
        return Completion(slope, at_s, 0.0, 0.0)
    if slope <= 0:
        return Completion(slope, at_s, None, None)
    left = max(0.0, 1.0 - (intercept + slope * at_s))
    rem50 = left / slope
    low = slow_slope(slopes, len(pts))
    if low <= 0:
        return Completion(slope, at_s, rem50, None)
    rem90 = max(left / low, rem50 * (1 + MIN_P90_SPREAD))
    return Completion(slope, at_s, rem50, rem90)
