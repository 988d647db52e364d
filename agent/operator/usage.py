"""Accounting over the mesh: every agent's rows summed, with no master (sans I/O).

Each agent keeps the rows of the attempts that ran on it (:mod:`agent.history.usage_book`).
``shoal usage`` asks every live agent for its rows and hands them here: they are deduplicated
by ``(job_id, attempt, node)`` (an agent asked twice, or through two addresses, counts once; a
closed row wins over an open copy of it), cut to the window asked for, split at each UTC
midnight, and summed by day and by team, user or GPU model. A running attempt counts up to the
time of the answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from agent.wire.usage import UsageRow

BY: Final = ("team", "user", "model")
DAY_S: Final = 86_400.0
_SINCE = re.compile(r"(\d+)([dhm])")
_UNIT_S: Final = {"d": DAY_S, "h": 3600.0, "m": 60.0}


def since_s(text: str, now: float) -> float:
    """``30d``, ``12h``, ``90m`` back from ``now``, or a date (``2026-11-01``, UTC)."""
    found = _SINCE.fullmatch(text.strip())
    if found:
        return now - int(found.group(1)) * _UNIT_S[found.group(2)]
    try:
        day = datetime.strptime(text.strip(), "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise ValueError(
            f"--since {text!r}: a duration (30d, 12h, 90m) or a date (YYYY-MM-DD)"
        ) from None
    return day.timestamp()


@dataclass(frozen=True, slots=True)
class UsageTotal:
    """One day's usage of one team, user or model (``key``; ``all`` when not grouped)."""

    day: str
    key: str
    gpu_s: float
    energy_j: float | None
    """``None``: none of its attempts had measured power."""
    attempts: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "day": self.day,
            "key": self.key,
            "gpu_s": round(self.gpu_s, 3),
            "gpu_hours": round(self.gpu_s / 3600.0, 6),
            "energy_kwh": None if self.energy_j is None else round(self.energy_j / 3.6e6, 6),
            "attempts": self.attempts,
        }


def dedupe(rows: Iterable[UsageRow]) -> list[UsageRow]:
    kept: dict[tuple[str, int, str], UsageRow] = {}
    for row in rows:
        key = (row.job_id, row.attempt, row.node)
        held = kept.get(key)
        if held is None or (held.finished_at is None and row.finished_at is not None):
            kept[key] = row
    return list(kept.values())


def _key(row: UsageRow, by: str | None) -> str:
    if by == "team":
        return row.team or "-"
    if by == "user":
        return row.name or (row.person[:10] if row.person else "-")
    if by == "model":
        return row.model
    return "all"


def totals(rows: Iterable[UsageRow], by: str | None, since: float, now: float) -> list[UsageTotal]:
    """Every row's GPU-seconds and energy within ``[since, now]``, by UTC day and ``by``."""
    sums: dict[tuple[str, str], list[Any]] = {}
    for row in dedupe(rows):
        end = row.finished_at if row.finished_at is not None else now
        start, stop = max(row.started_at, since), min(end, now)
        span_s = end - row.started_at
        at = start
        while at < stop:
            day_end = (at // DAY_S + 1) * DAY_S
            cut = min(stop, day_end)
            day = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d")
            entry = sums.setdefault((day, _key(row, by)), [0.0, None, set()])
            entry[0] += (cut - at) * row.gpus
            if row.energy_j is not None and span_s > 0:
                entry[1] = (entry[1] or 0.0) + row.energy_j * (cut - at) / span_s
            entry[2].add((row.job_id, row.attempt, row.node))
            at = cut
    return [
        UsageTotal(day, key, gpu_s, energy_j, len(seen))
        for (day, key), (gpu_s, energy_j, seen) in sorted(sums.items())
    ]


def grand_total(found: list[UsageTotal]) -> UsageTotal:
    energies = [t.energy_j for t in found if t.energy_j is not None]
    return UsageTotal(
        "all",
        "all",
        sum(t.gpu_s for t in found),
        sum(energies) if energies else None,
        sum(t.attempts for t in found),
    )
