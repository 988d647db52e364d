"""``shoal history NODE|JOB``: a node's stored samples (``GET /v1/history``) as terminal charts.

Each node answers from its own store, so the command asks the node itself: the agent given by
``--agent`` (or the fleet's first) resolves NODE or JOB (a job's history is on the node that
runs, or last ran, it) and tells the node's address; the command then asks that agent. Output:
one sparkline per series (the average of each step, scaled from the series' own minimum to its
maximum), ``--json`` (the agent's answer) or ``--csv`` (``node,series,subject,t,min,avg,max``).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agent.cli.ops_cmd import operator_identity, print_json, resolve_job, run_with_client
from agent.common.errors import UserError
from agent.operator.client import ApiClient, ApiError
from agent.operator.resolve import pick_node
from agent.operator.terminal import line_width
from agent.operator.units import fmt_bytes
from agent.wire.codec import WireError
from agent.wire.history import HistoryDoc, HistoryQuery, HistorySeries

BARS = "▁▂▃▄▅▆▇█"
ASCII_BARS = "_.-=+*#@"
CHART_POINTS = 600
"""About how many points the command asks for when ``--step`` is not given."""


async def _target(client: ApiClient, text: str) -> tuple[Mapping[str, Any], str | None]:
    """The node whose history to read, and the job (``None`` for a node's own history)."""
    nodes = await client.nodes()
    try:
        return pick_node(nodes, text), None
    except UserError as as_node:
        try:
            job = await resolve_job(client, text)
        except UserError:
            raise as_node from None
    runner = job.get("runner")
    if not runner:
        raise UserError(f"job {str(job.get('job_id'))[:12]} has not run on any node yet")
    found = [n for n in nodes if n.get("node_id") == runner]
    if not found:
        job_id = str(job.get("job_id"))[:12]
        raise UserError(f"job {job_id} ran on {runner[:12]}, which is gone from the mesh")
    return found[0], str(job["job_id"])


def _query(args: argparse.Namespace, node_id: str, job: str | None) -> HistoryQuery:
    now = time.time()
    names = tuple(n.strip() for s in args.series or () for n in s.split(",") if n.strip())
    since = int(args.since)
    step = args.step if args.step is not None else max(1, since // CHART_POINTS)
    return HistoryQuery(
        names,
        node_id,
        args.device,
        job,
        int(now) - since,
        math.ceil(now) + 1,
        int(step),
        hints=job is None,
    )


def fetch(args: argparse.Namespace) -> HistoryDoc:
    """Resolve the target through one agent, then ask the target node's agent."""

    async def call(client: ApiClient) -> HistoryDoc:
        node, job = await _target(client, args.target)
        node_id = str(node["node_id"])
        query = _query(args, node_id, job)
        me = (await client.health()).get("node_id")
        if me == node_id:
            answer = await client.get("/v1/history", query.to_params())
        else:
            address = node.get("addr")
            if not address or node.get("state") != "alive":
                raise UserError(f"node {node_id[:12]} is not alive: its history is on it")
            identity, _ = operator_identity(args)
            async with ApiClient(identity, str(address)) as there:
                answer = await there.get("/v1/history", query.to_params())
        try:
            return HistoryDoc.from_wire(answer)
        except WireError as exc:
            raise UserError(f"the agent answered an unreadable history: {exc}") from None

    doc: HistoryDoc = run_with_client(args, call)
    return doc


def sparkline(values: Sequence[float | None], width: int, bars: str = BARS) -> str:
    """``values`` squeezed into ``width`` cells (each the average of its values; a space where
    none), scaled from their minimum to their maximum."""
    if not values or width <= 0:
        return ""
    cells: list[float | None] = []
    for i in range(min(width, len(values))):
        lo = i * len(values) // min(width, len(values))
        hi = (i + 1) * len(values) // min(width, len(values))
        got = [v for v in values[lo:hi] if v is not None]
        cells.append(sum(got) / len(got) if got else None)
    known = [c for c in cells if c is not None]
    if not known:
        return " " * len(cells)
    low, high = min(known), max(known)
    top = len(bars) - 1
    return "".join(
        " "
        if c is None
        else bars[0 if high == low else min(top, int((c - low) / (high - low) * top + 0.5))]
        for c in cells
    )


def _num(value: float | None) -> str:
    if value is None:
        return "N/A"
    if abs(value) >= 1e9:
        return f"{value / 1e9:.1f}G"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.1f}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.1f}k"
    return f"{value:.1f}" if value != int(value) else str(int(value))


_RATE_UNITS = ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"))


def in_units(name: str, value: float | None) -> str:
    """A value of series ``name`` in the unit its name ends with, as a person reads it:
    ``312 W`` for ``_mw``, ``43.5 GiB`` for ``_bytes``, ``1.2 MB/s``, ``71%``, ``64°C``, ``0.4 ms``;
    a name with no known unit, the bare number."""
    if value is None:
        return "N/A"
    if name.endswith("_bytes_per_s"):
        for factor, unit in _RATE_UNITS:
            if abs(value) >= factor:
                return f"{value / factor:.1f} {unit}"
        return f"{value:.0f} B/s"
    if name.endswith("_bytes"):
        return fmt_bytes(int(value))
    if name.endswith("_mw"):
        watts = value / 1000
        return f"{watts:.0f} W" if abs(watts) >= 10 else f"{watts:.1f} W"
    if name.endswith("_pct"):
        return f"{value:.0f}%"
    if name.endswith("_c"):
        return f"{value:.0f}°C"
    if name.endswith("_ms"):
        return f"{value:.1f} ms"
    return _num(value)


def chart_lines(doc: HistoryDoc, width: int, ascii_only: bool = False) -> list[str]:
    """Two lines per series: its name, subject, last value and range; then its sparkline. Then
    the bottleneck hints that fired (a node's history), one a line."""
    lines = []
    for s in doc.series:
        label = s.name + (f" {s.subject[:24]}" if s.subject else "")
        if s.unsupported is not None:
            lines.append(f"{label}: unsupported ({s.unsupported})")
            continue
        avgs = [p[2] for p in s.points]
        known = [v for v in avgs if v is not None]
        lows = [p[1] for p in s.points if p[1] is not None]
        highs = [p[3] for p in s.points if p[3] is not None]
        if not known:
            lines.append(f"{label}: no samples in this span")
            continue
        low, high, last = (in_units(s.name, v) for v in (min(lows), max(highs), known[-1]))
        span = f"min {low}  max {high}  last {last}"
        lines.append(f"{label}  ({span}; every {s.step_s}s)")
        lines.append("  " + sparkline(avgs, width - 2, ASCII_BARS if ascii_only else BARS))
    if not doc.series:
        lines.append("no history matches (see --series and --device)")
    fired = [h for h in doc.hints if not h.unjudged]
    lines += [f"hint: {h.device[:24]} {h.rule}: {h.evidence}" for h in fired]
    return lines


def _csv(doc: HistoryDoc, series: Sequence[HistorySeries]) -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["node", "series", "subject", "t", "min", "avg", "max"])
    for s in series:
        for t, low, avg, high in s.points:
            values = ("" if v is None else v for v in (low, avg, high))
            out.writerow([doc.node, s.name, s.subject, t, *values])


def cmd_history(args: argparse.Namespace) -> int:
    if args.fleet or args.target is None:
        from agent.cli.fleet_view import cmd_fleet  # it draws with this module's bars

        return cmd_fleet(args)
    try:
        doc = fetch(args)
    except ApiError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print_json(doc.to_wire())
    elif args.csv:
        _csv(doc, doc.series)
    else:
        encoding = (getattr(sys.stdout, "encoding", None) or "").lower()
        for line in chart_lines(doc, line_width(), ascii_only="utf" not in encoding):
            print(line)
    return 0
