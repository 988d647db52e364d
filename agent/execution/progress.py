"""The progress convention jobs can use, and an ETA from the rate they report. No I/O, no clock.

A job reports progress in either of two ways:

- a line on stdout: ``SHOAL_PROGRESS <fraction> [message]``, e.g. ``SHOAL_PROGRESS 0.42 epoch 3/7``;
- the file named by ``$SHOAL_PROGRESS_FILE``, holding ``<fraction> [message]``, rewritten as it
  goes (write a temporary file and rename it over, so a reader never sees half a number).

The fraction is between 0 and 1; ``42%`` is accepted too. Anything else is ignored, never an error:
a job's output is not ours to reject.

The ETA comes from the job's own progress history (:mod:`agent.job.progressfit`): a
robust (Theil-Sen) slope over the attempt's reports, so a few wild or stalled reports do not make
it jump, with a p50 and a p90. The tracker keeps at most
:data:`~agent.job.progressfit.MAX_POINTS` reports, thinning the history (every other one
dropped) when full, so the whole attempt stays covered; with ``window_s`` only the reports of
that last span count. Once it holds a few reports, at most one a second is fitted (a job
printing progress a thousand times a second costs no more than one that prints it once). Small
steps back are noise and are fitted; a report far back (more than :data:`RESTART_DROP` below the
last ones) is set aside, and if the next is far back too the job went back (a restart from its
own checkpoint) and the history starts afresh from those two.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from agent.job.progressfit import MAX_POINTS, completion

PROGRESS_PREFIX: Final = "SHOAL_PROGRESS"
PROGRESS_FILE_ENV: Final = "SHOAL_PROGRESS_FILE"


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """The latest progress of one job."""

    fraction: float
    """Done so far, 0..1."""
    message: str | None
    updated_at: float
    """When it was reported (the clock of whoever fed the tracker)."""
    rate_per_s: float | None
    """Fraction per second over the window; ``None`` until two reports are apart in time."""
    eta_s: float | None
    """Seconds left at that rate (the p50), from ``updated_at``; ``None`` when the rate is
    unknown or not positive; 0 when done."""
    eta_p90_s: float | None = None
    """Seconds left at the slow end of the rate's spread (the p90), from ``updated_at``."""


def parse_fraction(text: str) -> tuple[float, str | None] | None:
    """``(fraction, message)`` from ``"0.42 epoch 3"`` or ``"42%"``; ``None`` if it is not one."""
    parts = text.strip().split(None, 1)
    if not parts:
        return None
    number = parts[0]
    try:
        value = float(number[:-1]) / 100.0 if number.endswith("%") else float(number)
    except ValueError:
        return None
    if not 0.0 <= value <= 1.0:  # also rejects nan
        return None
    message = parts[1].strip() if len(parts) > 1 else None
    return value, (message or None)


def parse_progress_line(line: str) -> tuple[float, str | None] | None:
    """``(fraction, message)`` from a ``SHOAL_PROGRESS ...`` output line, else ``None``."""
    stripped = line.strip()
    if not stripped.startswith(PROGRESS_PREFIX):
        return None
    rest = stripped[len(PROGRESS_PREFIX) :]
    if rest and not rest[0].isspace():
        return None
    return parse_fraction(rest)


class ProgressTracker:
    """Keeps one job's progress and the history that its ETA is computed from."""

    def __init__(
        self,
        window_s: float | None = None,
        max_points: int = MAX_POINTS,
        min_gap_s: float = 1.0,
    ) -> None:
        self._window_s = window_s
        self._max_points = max(2, max_points)
        self._min_gap_s = min_gap_s
        self._points: list[tuple[float, float]] = []
        self._suspect: tuple[float, float] | None = None
        """A report far below the last ones, held until the next says whether the job went
        back (a restart from its checkpoint) or the report was wild."""
        self._latest: ProgressReport | None = None

    @property
    def latest(self) -> ProgressReport | None:
        return self._latest

    @property
    def points(self) -> tuple[tuple[float, float], ...]:
        """The reports the ETA is fitted to, ``(t, fraction)``, oldest first."""
        return tuple(self._points)

    def update(self, fraction: float, message: str | None, now: float) -> ProgressReport:
        """Record a report taken at ``now`` and return the resulting progress."""
        fraction = min(1.0, max(0.0, fraction))
        if self._points and fraction < _median(f for _, f in self._points[-3:]) - RESTART_DROP:
            if self._suspect is None:  # one report far back: wild, unless the next agrees
                self._suspect = (now, fraction)
                return self._carry(fraction, message, now)
            self._points = [self._suspect]  # two in a row: the job went back; start afresh
        self._suspect = None
        if (
            len(self._points) >= _ALWAYS_FITTED
            and fraction < 1.0
            and now - self._points[-1][0] < self._min_gap_s
        ):
            return self._carry(fraction, message, now)
        self._points.append((now, fraction))
        if self._window_s is not None:
            while len(self._points) > 2 and now - self._points[0][0] > self._window_s:
                del self._points[0]
        if len(self._points) > self._max_points:
            self._points = self._points[-1::-2][::-1]  # every other one, the newest kept
        fit = completion(self._points)
        rate = None if fit is None else fit.rate_per_s
        eta: float | None = None if fit is None else fit.remaining_p50_s
        eta90 = None if fit is None else fit.remaining_p90_s
        if fraction >= 1.0:
            eta = eta90 = 0.0
        self._latest = ProgressReport(fraction, message, now, rate, eta, eta90)
        return self._latest

    def _carry(self, fraction: float, message: str | None, now: float) -> ProgressReport:
        """A report not fitted: the fraction is shown, the last fit's ETA counts down."""
        latest = self._latest
        if latest is None:
            self._latest = ProgressReport(fraction, message, now, None, None)
            return self._latest
        elapsed = max(0.0, now - latest.updated_at)
        self._latest = ProgressReport(
            fraction,
            message,
            now,
            latest.rate_per_s,
            _less(latest.eta_s, elapsed),
            _less(latest.eta_p90_s, elapsed),
        )
        return self._latest


_ALWAYS_FITTED: Final = 8
"""Below this many reports every report is fitted (a few pairs: cheap)."""
RESTART_DROP: Final = 0.05
"""A report this far below the median of the last three fitted is a step back: taken as a
restart when the next report is as far back too, else as a wild report (not fitted)."""


def _median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _less(eta_s: float | None, elapsed_s: float) -> float | None:
    return None if eta_s is None else max(0.0, eta_s - elapsed_s)
