"""What the history panel asks a node for (sans-I/O): the series of a GPU, a host or a job over
one of four windows, as ``shoal history`` asks (:mod:`agent.cli.history_cmd`), and a simulated
answer for the simulated mesh."""

from __future__ import annotations

import hashlib
import math
from typing import Final, Literal, NamedTuple

from agent.cli.history_cmd import CHART_POINTS
from agent.wire.history import HistoryDoc, HistoryQuery, HistorySeries

Subject = Literal["gpu", "host", "job"]
WINDOWS: Final[tuple[tuple[str, int], ...]] = (
    ("5m", 300),
    ("1h", 3600),
    ("24h", 86400),
    ("7d", 7 * 86400),
)
"""The windows the panel's keys 1-4 switch between."""
SERIES: Final[dict[Subject, tuple[str, ...]]] = {
    "gpu": ("gpu.util_pct", "gpu.mem_used_bytes", "gpu.temp_c", "gpu.power_mw"),
    "host": ("host.cpu_pct", "host.mem_used_bytes", "host.net_rx_bytes_per_s", "gpu.util_pct"),
    "job": ("job.progress_pct", "job.cpu_pct", "job.mem_bytes"),
}


class HistoryTarget(NamedTuple):
    """Whose history: a GPU (``device``), a host, or a job (on ``node``, its runner)."""

    subject: Subject
    node: str
    address: str
    """The node's agent: each node answers from its own store."""
    label: str
    device: str | None = None
    job: str | None = None


def history_query(target: HistoryTarget, span_s: int, now: float) -> HistoryQuery:
    """The query for ``target`` over the last ``span_s``, about :data:`CHART_POINTS` steps."""
    step = max(1, span_s // CHART_POINTS)
    return HistoryQuery(
        SERIES[target.subject],
        target.node,
        target.device,
        target.job,
        int(now) - span_s,
        math.ceil(now) + 1,
        step,
        hints=target.subject != "job",
    )


_RANGES: Final[dict[str, tuple[float, float]]] = {
    "gpu.util_pct": (5.0, 95.0),
    "gpu.mem_used_bytes": (4e9, 70e9),
    "gpu.temp_c": (38.0, 78.0),
    "gpu.power_mw": (90_000.0, 620_000.0),
    "host.cpu_pct": (3.0, 60.0),
    "host.mem_used_bytes": (40e9, 300e9),
    "host.net_rx_bytes_per_s": (1e5, 9e8),
    "job.progress_pct": (0.0, 100.0),
    "job.cpu_pct": (20.0, 400.0),
    "job.mem_bytes": (2e9, 60e9),
}


def simulated(query: HistoryQuery, subjects: dict[str, tuple[str, ...]]) -> HistoryDoc:
    """A deterministic answer shaped as an agent's: each series a mix of a day's cycle, slower
    swings and a seeded ripple, within the series' usual range. ``subjects``: series name ->
    the subjects it has on the node (GPU keys; the job id; ``""`` for the host)."""
    step = query.step_s or 1
    start = query.from_s - query.from_s % step
    out = []
    for name in query.series:
        low, high = _RANGES.get(name, (0.0, 100.0))
        for subject in subjects.get(name, ("",)):
            seed = int.from_bytes(hashlib.sha256(f"{name}|{subject}".encode()).digest()[:4])
            phase = (seed % 1000) / 1000 * 2 * math.pi
            points = []
            for t in range(start, query.to_s, step):
                if name == "job.progress_pct":
                    frac = min(1.0, max(0.0, (t - (query.to_s - 5400)) / 7200))
                else:
                    day = math.sin(2 * math.pi * t / 86400 + phase)
                    swing = math.sin(2 * math.pi * t / 1800 + 2 * phase)
                    ripple = math.sin(t * 0.7 + seed % 97)
                    frac = 0.5 + 0.3 * day + 0.12 * swing + 0.05 * ripple
                    frac = min(1.0, max(0.0, frac))
                avg = round(low + (high - low) * frac, 2)
                spread = (high - low) * 0.03
                points.append((t, round(avg - spread, 2), avg, round(avg + spread, 2)))
            out.append(HistorySeries(name, subject, None, "sim", step, tuple(points)))
    return HistoryDoc(query.node or "", query.from_s, query.to_s, tuple(out))


def padded(doc: HistoryDoc) -> HistoryDoc:
    """``doc`` with every series given a point (``None`` where no sample) at each step of the
    whole window, so a chart puts what there is where it belongs in time: a node that started a
    minute ago shows a minute at the right end of an hour, not an hour's width of it."""
    series = []
    for s in doc.series:
        if s.unsupported is not None or not s.points or s.step_s <= 0:
            series.append(s)
            continue
        have = {p[0]: p for p in s.points}
        first = s.points[0][0] - (s.points[0][0] - doc.from_s) // s.step_s * s.step_s
        steps = range(first, max(doc.to_s, s.points[-1][0] + 1), s.step_s)
        points = tuple(have.get(t, (t, None, None, None)) for t in steps)
        extra = tuple(p for p in s.points if p[0] not in set(steps))
        series.append(s._replace(points=tuple(sorted(points + extra))))
    return doc._replace(series=tuple(series))
