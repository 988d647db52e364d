"""The fleet's history as terminal text: utilization by vendor and by model (a busy and an
allocated line each, on a fixed 0-100% scale), then the GPU-hours left idle while jobs waited,
by model; the TUI's fleet view styles the same runs (:mod:`agent.operator.fleet_read` reads
what it draws)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

from agent.cli.history_cmd import ASCII_BARS, BARS
from agent.cli.ops_cmd import print_json, run_with_client
from agent.cli.usage_cmd import gather_usage
from agent.common.errors import UserError
from agent.operator.client import ApiClient
from agent.operator.fleet_read import FleetReport, ask_history, read_fleet, report_json
from agent.operator.terminal import line_width
from agent.wire.history import HistoryDoc, HistoryQuery
from agent.wire.usage import UsageRow


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


def _label(name: str, width: int, cut: str = "…") -> str:
    return (name if len(name) <= width else name[: width - 1] + cut).ljust(width)


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
    cut = "~" if ascii_only else "…"

    def cell(name: str, width: int) -> str:
        return _label(name, width, cut)

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
                [(cell(short_model(g.name) if by_model else g.name, label_w) + " ", "")],
                [("  ", ""), (cell(count, label_w - 2) + " ", "muted")],
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
                f"of {_hours(idle.free_gpu_s)} unallocated; {idle.waits} "
                f"wait{'s' * (idle.waits != 1)}",
                "muted",
            ),
        ]
    )
    top = max((max(line.idle_gpu_s, default=0.0) for line in idle.lines), default=0.0)
    reported = {g.name: g.gpus for g in report.by_model}
    for line in idle.lines:
        counts = reported.get(line.model, ())
        steps: list[float | None] = [
            v if i < len(counts) and counts[i] else None for i, v in enumerate(line.idle_gpu_s)
        ]
        spark = level_line(steps, chart_w, top, bars).ljust(chart_w)  # blank: none reported
        figure = _right(_hours(line.total_gpu_s) + " h", 10)
        rows.append(
            [
                (cell(short_model(line.model), label_w) + " ", ""),
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


class _AgentReads:
    """The fleet's reads through one agent (the nodes' own agents for their history)."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    def now(self) -> float:
        return time.time()

    async def nodes(self) -> list[dict[str, Any]]:
        return await self.client.nodes()

    async def jobs(self) -> list[dict[str, Any]]:
        return await self.client.jobs()

    async def history(self, query: HistoryQuery, address: str) -> HistoryDoc:
        return await ask_history(self.client, query, address)

    async def usage(self, since: float) -> tuple[list[UsageRow], list[str]]:
        return await gather_usage(self.client, self.client.identity, since)


def cmd_fleet(args: argparse.Namespace) -> int:
    """``shoal history --fleet [--since SPAN] [--json]``."""
    if not args.fleet:
        raise UserError("say whose history: a node, a job, or --fleet")
    if args.target is not None:
        raise UserError(f"--fleet reads every node: leave out {args.target!r}")
    for flag in ("series", "device", "step", "csv"):
        if getattr(args, flag):
            raise UserError(f"--{flag} does not go with --fleet")

    async def call(client: ApiClient) -> FleetReport:
        return await read_fleet(_AgentReads(client), int(args.since))

    report: FleetReport = run_with_client(args, call)
    if args.json:
        print_json(report_json(report))
        return 0
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower()
    lines = fleet_lines(report, line_width(), ascii_only="utf" not in encoding)
    step = report.grid.step_s
    print(f"fleet history, {report.nodes_read} nodes answered, every {step}s")
    for line in lines:
        print(line.rstrip())
    return 0
