"""The datasets and usage views.

Datasets: each dataset version in the mesh, its size, and where its copies are. Its rows are
``shoal data ls``'s (:func:`agent.cli.data_cmd.copies`, grouped by version), read from the
nodes' ``dataset_versions`` in the snapshot the other views show: no second read.

Usage: GPU-hours and energy by team, user or GPU model over a window, ``shoal usage``'s totals
(:func:`agent.operator.usage.totals`) over every live agent's ``GET /v1/usage`` rows, read when
the view is shown or switched (not on every tick: it asks every agent).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, NamedTuple

from textual.binding import Binding, BindingType

from agent.cli.data_cmd import by_version, copies, held_pct
from agent.operator.units import fmt_bytes
from agent.operator.usage import BY, DAY_S, UsageTotal, grand_total, totals
from agent.wire.usage import UsageRow
from tui.messages import UsageWanted
from tui.model import MeshSnapshot
from tui.widgets.base import Selection, ViewContext
from tui.widgets.render import Part, duration
from tui.widgets.tables import Column, MeshTable, Row, SortSpec


class DatasetRow(NamedTuple):
    """One version of a dataset and its copies (rows of :func:`copies`, one per node)."""

    name: str
    digest: str | None
    size_bytes: int
    created_s: float | None
    held: tuple[Mapping[str, Any], ...]

    @property
    def key(self) -> str:
        return f"{self.name}@{self.digest or '-'}"

    @property
    def whole(self) -> int:
        """How many nodes hold all of it."""
        return sum(1 for r in self.held if int(r["held_bytes"]) >= int(r["total_bytes"]))

    @property
    def best_frac(self) -> float:
        return max(
            (int(r["held_bytes"]) / int(r["total_bytes"]) if int(r["total_bytes"]) else 1.0)
            for r in self.held
        )

    def raw(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "digest": self.digest,
            "total_bytes": self.size_bytes,
            "created_s": self.created_s,
            "copies": [dict(r) for r in self.held],
        }


def dataset_rows(snapshot: MeshSnapshot) -> list[DatasetRow]:
    """The mesh's dataset versions, as ``shoal data ls`` lists them."""
    nodes = [h.raw for h in snapshot.hosts]
    out = []
    for (name, digest), held in by_version(copies(nodes)).items():
        out.append(
            DatasetRow(
                name=name,
                digest=digest,
                size_bytes=max(int(r["total_bytes"]) for r in held),
                created_s=max((r["created_s"] for r in held if r["created_s"]), default=None),
                held=tuple(held),
            )
        )
    return out


def where_held(row: DatasetRow) -> str:
    """``gpu-h100-000 100%, gpu-h100-003 40%``: whole copies first."""
    ordered = sorted(row.held, key=lambda r: (-int(r["held_bytes"]), str(r["host"])))
    return ", ".join(f"{r['host']} {held_pct(r)}" for r in ordered)


class DatasetsTable(MeshTable):
    view_name = "datasets"
    COLUMNS = (
        Column("name", "Dataset", 16, grow=8),
        Column("version", "Version", 12),
        Column("size", "Size", 10, right=True),
        Column("made", "Made", 5, right=True),
        Column("whole", "Whole", 5, right=True),
        Column("copies", "Copies: host, held", 20, stretch=True),
    )
    SORTS: ClassVar[Mapping[str, SortSpec]] = {
        "name": (lambda r: (r.name, -(r.created_s or 0.0)), False),
        "util": (lambda r: (r.whole, r.best_frac), True),
        "mem": (lambda r: r.size_bytes, True),
    }
    """For datasets: N by name, U by copies (whole, then the most complete), M by size."""

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        node_id = ctx.scope.node_id
        for row in dataset_rows(ctx.snapshot):
            if node_id is None or any(r["node"] == node_id for r in row.held):
                yield row.key, row

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        row: DatasetRow = item
        hosts = " ".join(str(r["host"]) for r in row.held)
        return f"{row.name} {row.digest or ''} {hosts}"

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        row: DatasetRow = item
        p = ctx.palette
        made = "-" if row.created_s is None else duration(ctx.snapshot.taken_at - row.created_s)
        whole = row.whole
        return (
            (row.name, None),
            ((row.digest or "-")[:12], p.muted),
            (fmt_bytes(row.size_bytes), None),
            (made, p.muted),
            (f"{whole}/{len(row.held)}", p.of("ok" if whole else "warn")),
            (where_held(row), None if whole else p.of("warn")),
        )

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        row = next((r for r in dataset_rows(snapshot) if r.key == key), None)
        if row is None:
            return None
        title = f"{row.name}@{(row.digest or '-')[:12]}"
        return Selection("dataset", raw=row.raw(), title=title)


USAGE_BY: tuple[str, ...] = BY
"""What the usage view groups by, in the order ``b`` cycles through."""
USAGE_WINDOWS: tuple[tuple[str, float], ...] = (
    ("24h", DAY_S),
    ("7d", 7 * DAY_S),
    ("30d", 30 * DAY_S),
)
"""The windows ``w`` cycles through."""


@dataclass(frozen=True, slots=True)
class UsageReport:
    """The mesh's usage over one window, grouped one way (what the usage view shows)."""

    by: str
    window: str
    since_s: float
    until_s: float
    totals: tuple[UsageTotal, ...]
    """One per team, user or model, summed over the window's days, most GPU-hours first."""
    total: UsageTotal
    missing: tuple[str, ...] = ()
    """Agents that did not answer, one line each."""


def usage_report(
    rows: Sequence[UsageRow], by: str, window: str, since: float, now: float, missing: Sequence[str]
) -> UsageReport:
    """``shoal usage --by BY``'s totals over ``[since, now]``, each key's days added up."""
    per_key: dict[str, list[UsageTotal]] = {}
    for t in totals(rows, by, since, now):
        per_key.setdefault(t.key, []).append(t)
    summed = [replace(grand_total(days), day=window, key=key) for key, days in per_key.items()]
    summed.sort(key=lambda t: (-t.gpu_s, t.key))
    return UsageReport(by, window, since, now, tuple(summed), grand_total(summed), tuple(missing))


def kwh(energy_j: float | None) -> str:
    if energy_j is None:
        return "N/A"
    value = energy_j / 3.6e6
    return f"{value:,.1f}" if value >= 10 else f"{value:.3f}"


def _hours(gpu_s: float) -> str:
    """GPU-hours: one decimal from 10 on, three below (a young mesh's minutes still show)."""
    hours = gpu_s / 3600
    return f"{hours:,.1f}" if hours >= 10 else f"{hours:.3f}"


class UsageTable(MeshTable):
    """GPU-hours and energy by team, user or GPU model over a window (``b``, ``w`` switch)."""

    view_name = "usage"
    COLUMNS = (
        Column("key", "Team/user/model", 18, grow=8),
        Column("hours", "GPU-hours", 10, right=True),
        Column("share", "Share", 6, right=True),
        Column("energy", "kWh", 9, right=True),
        Column("attempts", "Runs", 5, right=True),
        Column("bar", "", 10, stretch=True),
    )
    SORTS: ClassVar[Mapping[str, SortSpec]] = {
        "name": (lambda t: t.key, False),
        "util": (lambda t: t.gpu_s, True),
        "mem": (lambda t: t.energy_j or -1.0, True),
    }
    """For usage: N by name, U by GPU-hours, M by energy."""

    BINDINGS: ClassVar[list[BindingType]] = [
        *MeshTable.BINDINGS,
        Binding("b", "by", "By", id="usage.by"),
        Binding("w", "window", "Window", id="usage.window"),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.report: UsageReport | None = None
        self.by = USAGE_BY[0]
        self.window = USAGE_WINDOWS[1][0]

    @property
    def window_s(self) -> float:
        return dict(USAGE_WINDOWS)[self.window]

    def action_by(self) -> None:
        """Group by the next of team, user and GPU model."""
        self.by = USAGE_BY[(USAGE_BY.index(self.by) + 1) % len(USAGE_BY)]
        self.post_message(UsageWanted())

    def action_window(self) -> None:
        """The next window: 24 hours, 7 days, 30 days."""
        names = [name for name, _ in USAGE_WINDOWS]
        self.window = names[(names.index(self.window) + 1) % len(names)]
        self.post_message(UsageWanted())

    def show_report(self, report: UsageReport, ctx: ViewContext) -> None:
        self.report = report
        self.apply(ctx)

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        if self.report is None:
            return
        for t in self.report.totals:
            yield t.key, t
        yield "\x00all", self.report.total

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        t: UsageTotal = item
        return t.key

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        t: UsageTotal = item
        p = ctx.palette
        total_s = self.report.total.gpu_s if self.report is not None else 0.0
        share = t.gpu_s / total_s if total_s > 0 else 0.0
        is_total = t.key == "all" and self.report is not None and t is self.report.total
        bar = "" if is_total else ctx.glyphs.bar(share, 10)[0]
        return (
            (
                "total" if is_total else "(none)" if t.key == "-" else t.key,
                p.muted if is_total else None,
            ),
            (_hours(t.gpu_s), None),
            (f"{100 * share:.0f}%", p.muted),
            (kwh(t.energy_j), p.muted if t.energy_j is None else None),
            (str(t.attempts), None),
            (bar, p.of("ok")),
        )

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        if self.report is None:
            return None
        found = next((t for t in self.report.totals if t.key == key), self.report.total)
        return Selection("usage", raw=found.to_wire(), title=f"{self.report.by} {found.key}")
