"""The table views (hosts, GPUs, jobs, events) on one base that updates rows in place.

Rows have stable keys (node id, ``node/device``, job id, event sequence). On every snapshot a
table compares each row's display values with the last ones and updates only the cells that
changed; rows come and go in batches; the table is rebuilt only when the filter or scope changes.
Every table fits 80 columns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from rich.console import RenderableType
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist, ColumnKey, RowDoesNotExist, RowKey

from tui.model import MeshSnapshot
from tui.widgets.base import Drill, Selection, SortKey, ViewContext
from tui.widgets.render import (
    Level,
    Palette,
    clip,
    duration,
    load_level,
    mem_pair,
    pct,
    state_level,
    temp,
    temp_level,
    watts,
)

Values = tuple[Any, ...]
Formatter = Callable[[Any, Palette], RenderableType]


class RowText(Text):
    """The first cell of a row: knows its row key, so a sort can find the row's values."""

    row_key: str = ""


def _plain(value: Any, palette: Palette) -> RenderableType:
    return "" if value is None else str(value)


def _leveled(value: Any, palette: Palette) -> RenderableType:
    """``value`` is ``(text, level)``."""
    text, level = value
    return Text(text, style=palette.of(level), no_wrap=True, end="")


def _state(value: Any, palette: Palette) -> RenderableType:
    return Text(str(value), style=palette.of(state_level(str(value))), no_wrap=True, end="")


def _util(value: Any, palette: Palette) -> RenderableType:
    level: Level = "muted" if value is None else load_level(float(value) / 100.0)
    return Text(pct(value), style=palette.of(level), justify="right", no_wrap=True, end="")


def _right(value: Any, palette: Palette) -> RenderableType:
    return Text("" if value is None else str(value), justify="right", no_wrap=True, end="")


class MeshTable(DataTable[RenderableType]):
    """A view over the snapshot as rows; subclasses say which rows and how they look."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "cursor_down", "Down", show=False, id="table.down"),
        Binding("k", "cursor_up", "Up", show=False, id="table.up"),
        Binding("g", "scroll_top", "Top", show=False, id="table.top"),
        Binding("G", "scroll_bottom", "Bottom", show=False, id="table.bottom"),
    ]

    COLUMNS: ClassVar[tuple[tuple[str, str, int, Formatter], ...]] = ()
    """``(key, label, width, formatter)`` per column."""
    SORTS: ClassVar[Mapping[str, tuple[Callable[[Values], Any], bool]]] = {}
    """Sort name -> (key on the row's values, descending)."""
    view_name: ClassVar[str] = ""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(
            id=id, cursor_type="row", zebra_stripes=False, cursor_foreground_priority="renderable"
        )
        self._values: dict[str, Values] = {}
        self._order: list[str] = []
        self._signature: object = None
        self.sort_key: SortKey | None = None
        self._ctx = ViewContext()

    def on_mount(self) -> None:
        for key, label, width, _ in self.COLUMNS:
            self.add_column(label, width=width, key=key)

    def on_resize(self) -> None:
        """The last column takes the width the others leave (it never shrinks below its own)."""
        if not self.COLUMNS:
            return
        fixed = sum(w for _, _, w, _ in self.COLUMNS[:-1]) + 2 * len(self.COLUMNS) + 1
        key, _, least, _ = self.COLUMNS[-1]
        column = self.columns.get(ColumnKey(key))
        if column is None:
            return
        width = max(least, self.size.width - fixed)
        if column.width != width:
            column.width = width
            self._require_update_dimensions = True
            self._clear_caches()
            self.refresh()

    # -- what subclasses provide -------------------------------------------------------------

    def table_rows(self, ctx: ViewContext) -> Iterable[tuple[str, Values, str]]:
        """``(row key, display values, text the filter searches)`` for every row in scope."""
        raise NotImplementedError

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        raise NotImplementedError

    # -- updating ----------------------------------------------------------------------------

    def _cells(self, values: Values, palette: Palette, key: str) -> list[RenderableType]:
        cells: list[RenderableType] = []
        for i, (column, value) in enumerate(zip(self.COLUMNS, values, strict=False)):
            cell = column[3](value, palette)
            if i == 0:
                first = RowText(cell if isinstance(cell, str) else str(value), no_wrap=True, end="")
                if isinstance(cell, Text):
                    first = RowText(cell.plain, style=cell.style, no_wrap=True, end="")
                first.row_key = key
                cell = first
            cells.append(cell)
        return cells

    def current_key(self) -> str | None:
        if not self.row_count:
            return None
        try:
            row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except CellDoesNotExist:
            return None
        return row_key.value

    def apply(self, ctx: ViewContext) -> None:
        """Bring the table to ``ctx``: cells in place, rows added/removed in batches."""
        self._ctx = ctx
        pattern = ctx.row_filter.compile()
        wanted: list[tuple[str, Values]] = [
            (key, values)
            for key, values, haystack in self.table_rows(ctx)
            if ctx.row_filter.keeps(haystack, pattern)
        ]
        signature = (ctx.row_filter.text, ctx.scope)
        cursor = self.current_key()
        palette = ctx.palette
        if signature != self._signature:
            self._signature = signature
            self.clear(columns=False)
            self._values = {}
            for key, values in wanted:
                self.add_row(*self._cells(values, palette, key), key=key)
                self._values[key] = values
        else:
            keep = {key for key, _ in wanted}
            for gone in [k for k in self._values if k not in keep]:
                with contextlib.suppress(RowDoesNotExist):
                    self.remove_row(gone)
                del self._values[gone]
            changes: list[tuple[str, str, RenderableType]] = []
            for key, values in wanted:
                old = self._values.get(key)
                if old is None:
                    self.add_row(*self._cells(values, palette, key), key=key)
                elif old != values:
                    for i in range(len(self.COLUMNS)):
                        if old[i] != values[i]:
                            column = self.COLUMNS[i]
                            cell = column[3](values[i], palette)
                            if i == 0:
                                cell = self._cells(values, palette, key)[0]
                            changes.append((key, column[0], cell))
                self._values[key] = values
            self._set_cells(changes)
        self._reorder([key for key, _ in wanted], cursor)

    def _set_cells(self, changes: list[tuple[str, str, RenderableType]]) -> None:
        """Update many cells with one repaint (``update_cell`` repaints once per cell)."""
        if not changes:
            return
        data = self._data
        for row, column, cell in changes:
            data[RowKey(row)][ColumnKey(column)] = cell
        self._update_count += 1
        self.refresh()

    def _reorder(self, natural: list[str], cursor: str | None) -> None:
        if self.sort_key is not None and self.sort_key in self.SORTS:
            key_of, descending = self.SORTS[self.sort_key]
            values = self._values
            order = sorted(natural, key=lambda k: key_of(values[k]), reverse=descending)
        else:
            order = natural
        if order != self._order:
            position = {k: i for i, k in enumerate(order)}
            self.sort(key=lambda cells: position.get(getattr(cells[0], "row_key", ""), 0))
            self._order = order
            if cursor is not None and cursor in position:
                self.move_cursor(row=position[cursor], animate=False, scroll=False)

    def sort_by(self, sort_key: SortKey) -> bool:
        """Order rows by ``sort_key``; False when this table has no such order."""
        if sort_key not in self.SORTS:
            return False
        self.sort_key = sort_key
        self._reorder(list(self._order), self.current_key())
        return True

    # -- selection ---------------------------------------------------------------------------

    def selection(self) -> Selection | None:
        key = self.current_key()
        return None if key is None else self.selection_for(key, self._ctx.snapshot)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        selection = self.selection()
        if selection is not None:
            self.post_message(Drill(selection))

    def select_key(self, key: str) -> bool:
        try:
            index = self.get_row_index(key)
        except RowDoesNotExist:
            return False
        self.move_cursor(row=index)
        return True


def _nz(value: float | None) -> float:
    return -1.0 if value is None else value


class HostsTable(MeshTable):
    view_name = "hosts"
    COLUMNS = (
        ("host", "Host", 14, _plain),
        ("state", "State", 7, _state),
        ("drain", "Drain", 11, _state),
        ("gpus", "GPU", 3, _right),
        ("util", "Util", 4, _util),
        ("mem", "GPU mem", 9, _leveled),
        ("temp", "Temp", 5, _leveled),
        ("jobs", "Job", 3, _right),
        ("age", "Seen", 5, _leveled),
    )
    SORTS = {
        "name": (lambda v: v[0], False),
        "util": (lambda v: _nz(v[4]), True),
        "mem": (lambda v: v[9], True),
        "temp": (lambda v: v[10], True),
    }

    def table_rows(self, ctx: ViewContext) -> Iterable[tuple[str, Values, str]]:
        for h in ctx.snapshot.hosts:
            if ctx.scope.node_id is not None and h.node_id != ctx.scope.node_id:
                continue
            used, total = h.mem_used_bytes, h.gpu_mem_total_bytes
            frac = None if used is None or not total else used / total
            hot = max(
                (d for d in h.devices if d.temp_c is not None),
                key=lambda d: (d.temp_c or 0.0) - (d.slowdown_c or 85.0),
                default=None,
            )
            t_level: Level = "muted" if hot is None else temp_level(hot.temp_c, hot.slowdown_c)
            age = h.telemetry_age_s
            age_level: Level = "bad" if h.state == "dead" else "warn" if h.stale else "muted"
            util = h.util_pct
            values: Values = (
                clip(h.hostname, 14),
                h.state,
                h.drain,
                len(h.devices),
                None if util is None else round(util),
                (clip(mem_pair(used, total), 9), load_level(frac)),
                (temp(None if hot is None else hot.temp_c), t_level),
                len(h.running_jobs),
                (duration(age) + ("!" if h.stale else ""), age_level),
                _nz(frac),
                _nz(None if hot is None else hot.temp_c),
            )
            first_gpu = h.devices[0].name if h.devices else ""
            haystack = " ".join(
                (h.hostname, h.node_id, h.state, h.drain, h.vendor, h.zone, h.os or "", first_gpu)
            )
            yield h.node_id, values, haystack

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        host = snapshot.host(key)
        if host is None:
            return None
        return Selection("host", node_id=key, raw=host.raw, title=host.hostname)


class GpusTable(MeshTable):
    view_name = "gpus"
    COLUMNS = (
        ("host", "Host", 14, _plain),
        ("index", "#", 2, _right),
        ("model", "Model", 12, _plain),
        ("util", "Util", 4, _util),
        ("mem", "Mem", 8, _leveled),
        ("temp", "Temp", 5, _leveled),
        ("power", "Power", 9, _plain),
        ("job", "Job", 8, _leveled),
    )
    SORTS = {
        "name": (lambda v: (v[0], v[1]), False),
        "util": (lambda v: _nz(v[3]), True),
        "mem": (lambda v: v[8], True),
        "temp": (lambda v: v[9], True),
    }

    def table_rows(self, ctx: ViewContext) -> Iterable[tuple[str, Values, str]]:
        snapshot = ctx.snapshot
        holder: dict[tuple[str, str], str] = {}
        for job in snapshot.jobs:
            if job.live and job.runner is not None:
                for key in job.devices:
                    holder[(job.runner, key)] = job.job_id
        scope = ctx.scope
        for h in snapshot.hosts:
            if scope.node_id is not None and h.node_id != scope.node_id:
                continue
            stale = h.stale
            for d in h.devices:
                if scope.device_key is not None and d.key != scope.device_key:
                    continue
                frac = d.mem_frac
                holding = holder.get((h.node_id, d.key))
                values: Values = (
                    clip(h.hostname, 14),
                    d.index,
                    clip(d.short_name, 12),
                    None if d.util_pct is None else round(d.util_pct),
                    (mem_pair(d.mem_used_bytes, d.mem_total_bytes), load_level(frac)),
                    (temp(d.temp_c), "muted" if stale else temp_level(d.temp_c, d.slowdown_c)),
                    watts(d.power_mw, d.power_limit_mw),
                    ("stale" if stale else (holding or "idle")[:8], "warn" if stale else "muted"),
                    _nz(frac),
                    _nz(d.temp_c),
                )
                haystack = (
                    f"{h.hostname} {h.node_id} {d.name} {d.vendor} {d.backend} {holding or ''}"
                )
                yield d.row_key, values, haystack

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        node_id, _, device_key = key.partition("/")
        host = snapshot.host(node_id)
        if host is None:
            return None
        device = next((d for d in host.devices if d.key == device_key), None)
        jobs = snapshot.jobs_on(node_id, device_key)
        return Selection(
            "gpu",
            node_id=node_id,
            device_key=device_key,
            job_id=jobs[0].job_id if jobs else None,
            raw=None if device is None else device.raw,
            title=f"{host.hostname} GPU {device.index if device else '?'}",
        )


class JobsTable(MeshTable):
    view_name = "jobs"
    COLUMNS = (
        ("job", "Job", 8, _plain),
        ("state", "State", 9, _state),
        ("owner", "Owner", 6, _plain),
        ("node", "Node", 12, _plain),
        ("gpus", "GPU", 3, _right),
        ("progress", "Done", 4, _right),
        ("eta", "ETA", 5, _right),
        ("why", "Command / why pending", 14, _leveled),
    )
    SORTS = {
        "name": (lambda v: v[0], False),
        "util": (lambda v: v[8], True),
        "mem": (lambda v: v[9], True),
        "temp": (lambda v: v[10], False),
    }
    """For jobs: N by id, U by progress, M by GPUs asked, T by predicted completion."""

    def table_rows(self, ctx: ViewContext) -> Iterable[tuple[str, Values, str]]:
        snapshot = ctx.snapshot
        scope = ctx.scope
        for j in snapshot.jobs:
            if scope.node_id is not None:
                if j.runner != scope.node_id or not j.live:
                    continue
                if scope.device_key is not None and scope.device_key not in j.devices:
                    continue
            why: tuple[str, Level]
            if j.state == "pending" and j.reason:
                why = (j.reason, "warn")
            elif j.state == "failed" and j.exit_code is not None:
                why = (f"exit {j.exit_code}: {j.command}", "bad")
            else:
                why = (j.command, "muted")
            values: Values = (
                j.job_id[:8],
                j.state,
                clip(snapshot.hostname(j.owner), 6),
                clip(snapshot.hostname(j.runner) if j.runner else "-", 12),
                j.gpus_per_node,
                "-" if j.progress is None else f"{100 * j.progress:.0f}%",
                duration(j.eta_s) if j.eta_s is not None else "-",
                why,
                _nz(j.progress),
                j.gpus_per_node,
                j.eta_s if j.eta_s is not None else float("inf"),
            )
            runner = snapshot.hostname(j.runner) if j.runner else ""
            haystack = f"{j.job_id} {j.state} {j.kind} {runner} {j.command} {j.reason or ''}"
            yield j.job_id, values, haystack

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        job = snapshot.job(key)
        if job is None:
            return None
        return Selection("job", node_id=job.runner, job_id=key, raw=job.raw, title=key[:8])


class EventsTable(MeshTable):
    view_name = "events"
    COLUMNS = (
        ("age", "Age", 5, _right),
        ("kind", "Kind", 6, _plain),
        ("node", "Node", 14, _plain),
        ("job", "Job", 8, _plain),
        ("message", "Message", 30, _plain),
    )
    SORTS = {"name": (lambda v: v[5], True)}
    MAX_EVENTS: ClassVar[int] = 2000

    def table_rows(self, ctx: ViewContext) -> Iterable[tuple[str, Values, str]]:
        snapshot = ctx.snapshot
        events: Sequence[Any] = snapshot.events[-self.MAX_EVENTS :]
        scope = ctx.scope
        for e in reversed(events):
            if scope.node_id is not None and e.node != scope.node_id:
                continue
            node = snapshot.hostname(e.node) if e.node else "-"
            values: Values = (
                duration(snapshot.taken_at - e.at),
                e.kind,
                clip(node, 14),
                (e.job_id or "-")[:8],
                e.message,
                e.seq,
            )
            yield str(e.seq), values, f"{e.kind} {node} {e.job_id or ''} {e.message}"

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        event = next((e for e in snapshot.events if str(e.seq) == key), None)
        if event is None:
            return None
        raw = {
            "seq": event.seq,
            "at": event.at,
            "kind": event.kind,
            "node": event.node,
            "job_id": event.job_id,
            "message": event.message,
        }
        if event.job_id is not None and snapshot.job(event.job_id) is not None:
            return Selection("job", node_id=event.node, job_id=event.job_id, raw=raw, title="event")
        if event.node is not None and snapshot.host(event.node) is not None:
            return Selection("host", node_id=event.node, raw=raw, title="event")
        return Selection("event", raw=raw, title=f"event {event.seq}")
