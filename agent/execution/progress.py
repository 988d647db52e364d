"""The progress convention jobs can use, and an ETA from the rate they report. No I/O, no clock.

A job reports progress in either of two ways:

- a line on stdout: ``SHOAL_PROGRESS <fraction> [message]``, e.g. ``SHOAL_PROGRESS 0.42 epoch 3/7``;
- the file named by ``$SHOAL_PROGRESS_FILE``, holding ``<fraction> [message]``, rewritten as it
  goes (write a temporary file and rename it over, so a reader never sees half a number).

The fraction is between 0 and 1; ``42%`` is accepted too. Anything else is ignored, never an error:
a job's output is not ours to reject.

The ETA is the remaining fraction over the rate seen in a sliding window (a few minutes), so a job
that speeds up or slows down is re-estimated quickly without jumping at every report. A fraction
that goes backwards (a restart from a checkpoint) starts the window afresh.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

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
    """Seconds left at that rate, from ``updated_at``; ``None`` when the rate is unknown or not
    positive; 0 when done."""


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
    """Keeps one job's progress and the recent history that its ETA is computed from."""

    def __init__(self, window_s: float = 300.0, max_points: int = 256) -> None:
        self._window_s = window_s
        self._points: deque[tuple[float, float]] = deque(maxlen=max_points)
        self._latest: ProgressReport | None = None

    @property
    def latest(self) -> ProgressReport | None:
        return self._latest

    def update(self, fraction: float, message: str | None, now: float) -> ProgressReport:
        """Record a report taken at ``now`` and return the resulting progress."""
        fraction = min(1.0, max(0.0, fraction))
        if self._points and fraction < self._points[-1][1]:
            self._points.clear()
        self._points.append((now, fraction))
        while len(self._points) > 2 and now - self._points[0][0] > self._window_s:
            self._points.popleft()
        rate = self._rate()
        if fraction >= 1.0:
            eta: float | None = 0.0
        elif rate is not None and rate > 0:
            eta = (1.0 - fraction) / rate
        else:
            eta = None
        self._latest = ProgressReport(fraction, message, now, rate, eta)
        return self._latest

    def _rate(self) -> float | None:
        t0, f0 = self._points[0]
        t1, f1 = self._points[-1]
        if t1 <= t0:
            return None
        return (f1 - f0) / (t1 - t0)
