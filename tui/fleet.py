"""What the fleet view reads and draws: every node's ``gpu.util_pct`` history, the usage rows and
the job records over one window, counted by :mod:`agent.operator.fleet_history`, and the chart
lines the view shows.

Reading is bounded: at most :data:`IN_FLIGHT` nodes are asked at once, each given
:data:`NODE_TIMEOUT_S`; a node that does not answer in time, or answers an error, is listed as
missing and its GPUs are left out of the shares (never counted as idle).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from agent.operator.client import ApiError
from agent.operator.fleet_history import (
    GpuTrack,
    Grid,
    GroupLine,
    IdleWhileWaiting,
    idle_while_waiting,
    utilization,
)
from agent.operator.fleet_inputs import UTIL_SERIES, FleetGpus, held, tracks, waits
from agent.wire.codec import WireError
from agent.wire.history import HistoryDoc, HistoryQuery
from tui.source import MeshSource

FLEET_POINTS: Final = 120
"""Steps over a window (the widest chart a terminal shows)."""
IN_FLIGHT: Final = 4
NODE_TIMEOUT_S: Final = 10.0
LIVE: Final = ("alive", "suspect")
BARS: Final = "▁▂▃▄▅▆▇█"
ASCII_BARS: Final = "_.-=+*#@"


@dataclass(frozen=True, slots=True)
class FleetReport:
    """The fleet over one window, as the view draws it."""

    span_s: int
    grid: Grid
    by_vendor: tuple[GroupLine, ...]
    by_model: tuple[GroupLine, ...]
    idle: IdleWhileWaiting
    nodes_read: int
    missing: tuple[str, ...]
    """One line for each node (or read) that did not answer: ``host: why``."""
    unreadable_jobs: int = 0


def _name(node: dict[str, Any]) -> str:
    host = node.get("host") or {}
    return str(host.get("hostname") or str(node.get("node_id", "?"))[:8])


async def read_fleet(
    source: MeshSource,
    span_s: int,
    *,
    in_flight: int = IN_FLIGHT,
    timeout_s: float = NODE_TIMEOUT_S,
) -> FleetReport:
    """Ask every live agent with GPUs for the last ``span_s`` of its GPUs' utilization (a few
    at a time), and the mesh for its usage rows and jobs; count what answered."""
    now = source.now()
    nodes, jobs = await asyncio.gather(source.nodes(), source.jobs())
    grid = Grid.over(int(now) - span_s, math.ceil(now) + 1, max(1, span_s // FLEET_POINTS))
    gpus = FleetGpus.from_nodes(nodes)
    with_gpus = {node for node, _ in gpus.statics}
    asked = [n for n in nodes if n.get("node_id") in with_gpus]
    missing = [f"{_name(n)}: {n.get('state')}" for n in asked if n.get("state") not in LIVE]
    asked = [n for n in asked if n.get("state") in LIVE]
    gate = asyncio.Semaphore(max(1, in_flight))

    async def one(node: dict[str, Any]) -> HistoryDoc:
        query = HistoryQuery(
            (UTIL_SERIES,), str(node["node_id"]), None, None, grid.from_s, grid.to_s, grid.step_s
        )
        async with gate:
            return await asyncio.wait_for(
                source.history(query, str(node.get("addr") or "")), timeout_s
            )

    answers = await asyncio.gather(*(one(n) for n in asked), return_exceptions=True)
    found: list[GpuTrack] = []
    for node, answer in zip(asked, answers, strict=True):
        if isinstance(answer, HistoryDoc):
            found += tracks(grid, answer, gpus)
        elif isinstance(answer, TimeoutError):
            missing.append(f"{_name(node)}: no answer in {timeout_s:g} s")
        elif isinstance(answer, ApiError | WireError | OSError):
            missing.append(f"{_name(node)}: {answer}")
        else:
            raise answer
    try:
        rows, unanswered = await asyncio.wait_for(source.usage(grid.from_s), timeout_s)
    except (TimeoutError, ApiError, WireError, OSError) as exc:
        rows, unanswered = [], [f"usage: {exc or 'no answer in time'}"]
    holding = held(rows)
    waited = waits(jobs, gpus)
    return FleetReport(
        span_s=span_s,
        grid=grid,
        by_vendor=utilization(grid, found, holding, "vendor"),
        by_model=utilization(grid, found, holding, "model"),
        idle=idle_while_waiting(grid, found, holding, waited.waits),
        nodes_read=len(asked) - sum(1 for a in answers if not isinstance(a, HistoryDoc)),
        missing=tuple(missing + [f"usage {m}" for m in unanswered]),
        unreadable_jobs=waited.unreadable,
    )


# -- drawing ------------------------------------------------------------------------------------


def level_line(values: Sequence[float | None], width: int, top: float, bars: str = BARS) -> str:
    """``values`` squeezed into ``width`` cells (each the mean of its values; a space where
    none), on a fixed scale from 0 to ``top``, so lines drawn with one ``top`` compare."""
    if not values or width <= 0:
        return ""
    cells = min(width, len(values))
    out = []
    for i in range(cells):
        got = [
            v
            for v in values[i * len(values) // cells : (i + 1) * len(values) // cells]
            if v is not None
        ]
        if not got:
            out.append(" ")
            continue
        frac = 0.0 if top <= 0 else min(1.0, max(0.0, sum(got) / len(got) / top))
        out.append(bars[min(len(bars) - 1, int(frac * (len(bars) - 1) + 0.5))])
    return "".join(out)


def _pct(value: float | None) -> str:
    return "N/A" if value is None else f"{value * 100:.0f}%"


def _last(values: Sequence[float | None]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


def _hours(gpu_s: float) -> str:
    """GPU-seconds as GPU-hours: ``0``, ``<0.01``, ``0.04``, ``3.5``, ``1,132``."""
    hours = gpu_s / 3600
    if hours <= 0:
        return "0"
    if hours < 0.01:
        return "<0.01"
    return f"{hours:.2f}" if hours < 0.1 else f"{hours:.1f}" if hours < 1000 else f"{hours:,.0f}"


_VENDOR_WORDS: Final = frozenset({"nvidia", "amd", "intel", "apple"})


def short_model(model: str) -> str:
    """A model's name without its vendor's (``H100 SXM``, ``Instinct MI300X``): the vendor is
    in the lines above, and the columns are narrow."""
    first, _, rest = model.partition(" ")
    return rest if first.lower() in _VENDOR_WORDS and rest else model


def _label(name: str, width: int) -> str:
    return (name if len(name) <= width else name[: width - 1] + "…").ljust(width)


Row = list[tuple[str, str]]
"""One line as ``(text, role)`` runs; roles: ``""``, ``title``, ``busy``, ``alloc``, ``idle``,
``muted``, ``value`` (the view gives each a style of the theme)."""


def _right(text: str, width: int, role: str = "value") -> Row:
    """``text`` right-aligned in ``width`` columns."""
    return [(text.rjust(width), role)]


def fleet_rows(report: FleetReport, width: int, *, ascii_only: bool = False) -> list[Row]:
    """The view: utilization by vendor and by model (a busy and an allocated line each, their
    share now and over the window at the end), then the idle GPU-hours by model."""
    bars = ASCII_BARS if ascii_only else BARS
    names = (
        [g.name for g in report.by_vendor]
        + [short_model(g.name) for g in report.by_model]
        + [short_model(line.model) for line in report.idle.lines]
    )
    label_w = min(max((len(n) for n in names), default=8), max(10, width // 5))
    chart_w = max(8, width - label_w - 20)
    rows: list[Row] = []
    for title, groups in (("by vendor", report.by_vendor), ("by model", report.by_model)):
        by_model = groups is report.by_model
        head = f"GPU utilization {title}".ljust(label_w + 7 + chart_w + 3)
        rows.append([(head, "title"), ("now", "muted"), ("   ", ""), ("avg", "muted")])
        if not groups:
            rows.append([("no GPU answered for this window", "muted")])
        for g in groups:
            count = f"{g.gpus_last} GPU{'s' * (g.gpus_last != 1)}"
            labels: tuple[Row, Row] = (
                [(_label(short_model(g.name) if by_model else g.name, label_w) + " ", "")],
                [("  ", ""), (_label(count, label_w - 2) + " ", "muted")],
            )
            for label, kind, values, avg in (
                (labels[0], "busy", g.busy, g.busy_avg),
                (labels[1], "alloc", g.allocated, g.allocated_avg),
            ):
                spark = level_line(values, chart_w, 1.0, bars).ljust(chart_w)
                now, mean = _right(_pct(_last(values)), 6), _right(_pct(avg), 6)
                rows.append([*label, (f"{kind:<5} ", kind), (spark, kind), *now, *mean])
        rows.append([])
    idle = report.idle
    rows.append(
        [
            ("GPU-hours idle while jobs waited: ", "title"),
            (_hours(idle.total_gpu_s) + " ", "idle"),
            (
                f"(of {_hours(idle.free_gpu_s)} GPU-hours unallocated; {idle.waits} "
                f"wait{'s' * (idle.waits != 1)} in this window)",
                "muted",
            ),
        ]
    )
    top = max((max(line.idle_gpu_s, default=0.0) for line in idle.lines), default=0.0)
    for line in idle.lines:
        spark = level_line(line.idle_gpu_s, chart_w, top, bars).ljust(chart_w)
        figure = _right(_hours(line.total_gpu_s) + " h", 10)
        rows.append(
            [
                (_label(short_model(line.model), label_w) + " ", ""),
                ("idle  ", "idle"),
                (spark, "idle"),
                *figure,
            ]
        )
    if report.missing:
        shown = "; ".join(report.missing[:3])
        more = f" and {len(report.missing) - 3} more" if len(report.missing) > 3 else ""
        rows += [[], [(f"not counted: {shown}{more}", "muted")]]
    if report.unreadable_jobs:
        rows.append([(f"{report.unreadable_jobs} job records did not decode (left out)", "muted")])
    return rows


def fleet_lines(report: FleetReport, width: int, *, ascii_only: bool = False) -> list[str]:
    """:func:`fleet_rows` as plain lines."""
    return [
        "".join(text for text, _ in row) for row in fleet_rows(report, width, ascii_only=ascii_only)
    ]
