"""The table views (hosts, GPUs, jobs, events): line-oriented, drawing only the rows on screen.

A table holds, per snapshot, the ordered list of its rows as ``(stable key, item)`` pairs: the
item is the model object itself (a host, ``(host, GPU, job holding it)``, a job, an event), so a
refresh of 8,000 GPU rows costs one pass over the snapshot and, with a sort key, one sort on a
number. Display strings are made only for the lines on screen, when they are drawn, and kept
until the next snapshot. The cursor follows its row's key across refreshes, sorts and filters.
Every table fits 80 columns; a text column at the end takes the width that is left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, NamedTuple

from rich.cells import cell_len, set_cell_size
from rich.style import Style
from textual import events
from textual.binding import BindingType
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tui.model import (
    EMPTY_SNAPSHOT,
    DeviceView,
    EventView,
    HostView,
    JobTimes,
    JobView,
    MeshSnapshot,
)
from tui.widgets.base import CURSOR_BINDINGS, CursorKeys, Drill, Selection, SortKey, ViewContext
from tui.widgets.render import (
    Level,
    Palette,
    Part,
    clip,
    duration,
    line_strip,
    load_level,
    mem_pair,
    oneline,
    pct,
    state_level,
    temp,
    temp_level,
    watts,
)


class Column(NamedTuple):
    key: str
    label: str
    width: int
    right: bool = False
    stretch: bool = False
    """The last column only: take the width the others leave."""
    grow: int = 0
    """Cells more this column takes on a terminal wide enough that the last column still
    gets twice its own width (a host name in full at 120 columns, never at the cost of 80)."""


_BOLD = Style(bold=True)
_UNDERLINE = Style(underline=True)
Row = tuple[str, Any]
"""``(stable key, item)``."""
SortSpec = tuple[Callable[[Any], Any], bool]
"""A key on the row's item, and whether the order is descending."""


def _fit(text: str, width: int, right: bool) -> str:
    """``text`` in exactly ``width`` cells, on one line: clipped with an ellipsis, or padded."""
    if not text.isprintable():
        text = oneline(text)
    n = len(text) if text.isascii() else cell_len(text)
    if n > width:
        return set_cell_size(text, max(0, width - 1)) + "…" if width > 0 else ""
    pad = " " * (width - n)
    return pad + text if right else text + pad


class MeshTable(CursorKeys, ScrollView, can_focus=True):
    """A view over the snapshot as rows; subclasses say which rows and how they look."""

    BINDINGS: ClassVar[list[BindingType]] = [*CURSOR_BINDINGS]

    DEFAULT_CSS = """
    MeshTable { height: 1fr; overflow-x: hidden; }
    """

    COLUMNS: ClassVar[tuple[Column, ...]] = ()
    SORTS: ClassVar[Mapping[str, SortSpec]] = {}
    """Sort name -> (key on the row's item, descending). Rows without a sort keep the
    snapshot's order; a sort is stable, so equal rows keep it too."""
    view_name: ClassVar[str] = ""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.sort_key: SortKey | None = None
        self._ctx = ViewContext()
        self._natural: list[Row] = []
        self._keys: list[str] = []
        self._items: list[Any] = []
        self._position: dict[str, int] | None = None
        self._cursor = 0
        self._cursor_key: str | None = None
        self._base: Style | None = None
        self._strips: dict[tuple[int, int], Strip] = {}
        """Drawn lines by (row, width), without the cursor; dropped on every change of rows."""
        self._widths: tuple[int, tuple[int, ...]] = (-1, ())

    # -- what subclasses provide -------------------------------------------------------------

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        """Every row in scope, in the snapshot's order."""
        raise NotImplementedError

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        """The text the ``/`` filter searches for this row."""
        raise NotImplementedError

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        """One ``(text, style)`` per column, for a row on screen."""
        raise NotImplementedError

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        raise NotImplementedError

    # -- updating ----------------------------------------------------------------------------

    def apply(self, ctx: ViewContext) -> None:
        """Bring the rows to ``ctx``; the cursor stays on its row's key."""
        self._ctx = ctx
        rows = list(self.table_rows(ctx))
        pattern = ctx.row_filter.compile()
        if pattern is not None:
            keeps, haystack = ctx.row_filter.keeps, self.haystack
            rows = [row for row in rows if keeps(haystack(row[1], ctx), pattern)]
        self._natural = rows
        self._order()

    def release(self) -> None:
        """Drop the rows (hidden and out of date: the snapshot they hold can be freed).

        The cursor's key is kept; the next :meth:`apply` rebuilds the rows around it.
        """
        self._ctx = replace(self._ctx, snapshot=EMPTY_SNAPSHOT)
        self._natural, self._keys, self._items = [], [], []
        self._position = None
        self._strips.clear()

    def _order(self) -> None:
        rows = self._natural
        spec = self.SORTS.get(self.sort_key) if self.sort_key is not None else None
        if spec is not None:
            key_of, descending = spec
            rows = sorted(rows, key=lambda row: key_of(row[1]), reverse=descending)
        self._keys = [key for key, _ in rows]
        self._items = [item for _, item in rows]
        self._position = None
        self._strips.clear()
        self._base = None
        self._restore_cursor()
        self.virtual_size = Size(self.scrollable_content_region.width, len(rows) + 1)
        self.refresh()

    def _restore_cursor(self) -> None:
        if self._cursor_key is not None:
            index = self.position().get(self._cursor_key)
            if index is not None:
                self._cursor = index
                return
        self._cursor = min(self._cursor, max(0, len(self._keys) - 1))
        self._cursor_key = self._keys[self._cursor] if self._keys else None

    def position(self) -> dict[str, int]:
        """Row key -> row index (made when first asked after a change)."""
        if self._position is None:
            self._position = {key: i for i, key in enumerate(self._keys)}
        return self._position

    def sort_by(self, sort_key: SortKey) -> bool:
        """Order rows by ``sort_key``; False when this table has no such order."""
        if sort_key not in self.SORTS:
            return False
        self.sort_key = sort_key
        self._order()
        self._scroll_to_cursor()
        return True

    # -- reading it (tests and actions) ------------------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self._keys)

    @property
    def cursor_row(self) -> int:
        return self._cursor

    def row_keys(self) -> list[str]:
        return list(self._keys)

    def get_row_index(self, key: str) -> int:
        """The row's index; ``KeyError`` when it is not shown."""
        return self.position()[key]

    def get_row_at(self, index: int) -> list[str]:
        """The row's cells as shown (without padding)."""
        return [text for text, _ in self.cells(self._items[index], self._ctx)]

    def get_cell(self, key: str, column: str) -> str:
        row = self.get_row_at(self.get_row_index(key))
        return row[[c.key for c in self.COLUMNS].index(column)]

    def current_key(self) -> str | None:
        return self._cursor_key if self._keys else None

    # -- selection and moving ----------------------------------------------------------------

    def selection(self) -> Selection | None:
        key = self.current_key()
        return None if key is None else self.selection_for(key, self._ctx.snapshot)

    def select_key(self, key: str) -> bool:
        index = self.position().get(key)
        if index is None:
            return False
        self._move_to(index)
        return True

    def _page_rows(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    def _scroll_to_cursor(self) -> bool:
        top = round(self.scroll_offset.y)
        if self._cursor < top:
            self.scroll_to(y=self._cursor, animate=False, immediate=True)
            return True
        if self._cursor >= top + self._page_rows():
            self.scroll_to(y=self._cursor - self._page_rows() + 1, animate=False, immediate=True)
            return True
        return False

    def _move_to(self, index: int) -> None:
        if not self._keys:
            return
        index = max(0, min(len(self._keys) - 1, index))
        old, self._cursor = self._cursor, index
        self._cursor_key = self._keys[index]
        if self._scroll_to_cursor():
            self.refresh()
        else:
            self.refresh_line(old + 1)  # virtual lines: the header is line 0
            self.refresh_line(index + 1)

    def _cursor_lines(self) -> int:
        return len(self._keys)

    def action_drill(self) -> None:
        selection = self.selection()
        if selection is not None:
            self.post_message(Drill(selection))

    def on_click(self, event: events.Click) -> None:
        if event.y >= 1:
            self._move_to(round(self.scroll_offset.y) + event.y - 1)
            if event.chain >= 2:
                self.action_drill()

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    # -- drawing -----------------------------------------------------------------------------

    def _base_style(self) -> Style:
        """The widget's own style under every line (asked of the DOM once, not per line)."""
        if self._base is None:
            self._base = self.rich_style
        return self._base

    def notify_style_update(self) -> None:
        self._base = None
        super().notify_style_update()

    def _column_widths(self, width: int) -> tuple[int, ...]:
        if self._widths[0] == width:
            return self._widths[1]
        widths = [c.width for c in self.COLUMNS]
        if self.COLUMNS and self.COLUMNS[-1].stretch:
            spare = width - sum(widths) - 2 * len(widths) - widths[-1]
            for i, column in enumerate(self.COLUMNS[:-1]):
                extra = max(0, min(column.grow, spare))
                widths[i] += extra
                spare -= extra
            fixed = sum(widths[:-1]) + 2 * len(widths)
            widths[-1] = max(widths[-1], width - fixed)
        self._widths = (width, tuple(widths))
        return self._widths[1]

    def _line(self, parts: Sequence[Part], width: int, base: Style) -> Strip:
        runs: list[Part] = []
        for (text, style), column, w in zip(
            parts, self.COLUMNS, self._column_widths(width), strict=False
        ):
            runs.append((" " + _fit(text, w, column.right) + " ", style))
        return line_strip(runs, width, base)

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        palette = self._ctx.palette
        base = self._base_style()
        if y == 0:
            labels = [(c.label, None) for c in self.COLUMNS]
            return self._line(labels, width, base + palette.header)
        index = round(self.scroll_offset.y) + y - 1
        if index >= len(self._keys):
            return Strip.blank(width, base)
        if index == self._cursor:
            cursor = palette.selected + _BOLD if self.has_focus else _UNDERLINE
            return self._line(self.cells(self._items[index], self._ctx), width, base + cursor)
        strip = self._strips.get((index, width))
        if strip is None:
            strip = self._line(self.cells(self._items[index], self._ctx), width, base)
            self._strips[(index, width)] = strip
        return strip


def _nz(value: float | None) -> float:
    return -1.0 if value is None else value


def _hottest(host: HostView) -> DeviceView | None:
    """The GPU closest to its own slowdown point."""
    return max(
        (d for d in host.devices if d.temp_c is not None),
        key=lambda d: (d.temp_c or 0.0) - (d.slowdown_c or 85.0),
        default=None,
    )


def _host_mem_frac(host: HostView) -> float | None:
    used, total = host.mem_used_bytes, host.gpu_mem_total_bytes
    return None if used is None or not total else used / total


def _util_cell(value: float | None, p: Palette) -> Part:
    level: Level = "muted" if value is None else load_level(value / 100.0)
    return pct(None if value is None else round(value)), p.of(level)


class HostsTable(MeshTable):
    view_name = "hosts"
    COLUMNS = (
        Column("host", "Host", 14),
        Column("state", "State", 7),
        Column("drain", "Drain", 11),
        Column("platform", "OS/arch", 14),
        Column("gpus", "GPU", 3, right=True),
        Column("util", "Util", 4, right=True),
        Column("mem", "GPU mem", 9),
        Column("temp", "Temp", 5),
        Column("jobs", "Job", 3, right=True),
        Column("age", "Seen", 5),
    )
    SORTS: ClassVar[Mapping[str, SortSpec]] = {
        "name": (lambda h: (h.hostname, h.node_id), False),
        "util": (lambda h: _nz(h.util_pct), True),
        "mem": (lambda h: _nz(_host_mem_frac(h)), True),
        "temp": (lambda h: _nz(None if (d := _hottest(h)) is None else d.temp_c), True),
    }

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        node_id = ctx.scope.node_id
        for h in ctx.snapshot.hosts:
            if node_id is None or h.node_id == node_id:
                yield h.node_id, h

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        h: HostView = item
        first_gpu = h.devices[0].name if h.devices else ""
        return " ".join(
            (h.hostname, h.node_id, h.state, h.drain, h.vendor, h.zone, h.platform, first_gpu)
        )

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        h: HostView = item
        p = ctx.palette
        hot = _hottest(h)
        t_level: Level = "muted" if hot is None else temp_level(hot.temp_c, hot.slowdown_c)
        age_level: Level = "bad" if h.state == "dead" else "warn" if h.stale else "muted"
        mem_level = load_level(_host_mem_frac(h))
        return (
            (h.hostname, None),
            (h.state, p.of(state_level(h.state))),
            (h.drain, p.of(state_level(h.drain))),
            (h.platform, p.muted),
            (str(len(h.devices)), None),
            _util_cell(h.util_pct, p),
            (mem_pair(h.mem_used_bytes, h.gpu_mem_total_bytes), p.of(mem_level)),
            (temp(None if hot is None else hot.temp_c), p.of(t_level)),
            (str(len(h.running_jobs)), None),
            (duration(h.telemetry_age_s) + ("!" if h.stale else ""), p.of(age_level)),
        )

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        host = snapshot.host(key)
        if host is None:
            return None
        return Selection("host", node_id=key, raw=host.raw, title=host.hostname)


GpuRow = tuple[HostView, DeviceView, str | None]
"""A GPU's row item: its host, itself, and the live job holding it."""


class GpusTable(MeshTable):
    view_name = "gpus"
    COLUMNS = (
        Column("host", "Host", 14),
        Column("index", "#", 2, right=True),
        Column("model", "Model", 12),
        Column("util", "Util", 4, right=True),
        Column("mem", "Mem", 8),
        Column("temp", "Temp", 5),
        Column("power", "Power", 9),
        Column("job", "Job", 8),
    )
    SORTS: ClassVar[Mapping[str, SortSpec]] = {
        "name": (lambda r: (r[0].hostname, r[0].node_id, r[1].index), False),
        "util": (lambda r: _nz(r[1].util_pct), True),
        "mem": (lambda r: _nz(r[1].mem_frac), True),
        "temp": (lambda r: _nz(r[1].temp_c), True),
    }

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        snapshot = ctx.snapshot
        holder = snapshot.holders()
        scope = ctx.scope
        for h in snapshot.hosts:
            if scope.node_id is not None and h.node_id != scope.node_id:
                continue
            node_id = h.node_id
            for d in h.devices:
                if scope.device_key is None or d.key == scope.device_key:
                    yield d.row_key, (h, d, holder.get((node_id, d.key)))

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        h, d, holding = item
        return f"{h.hostname} {h.node_id} {d.name} {d.vendor} {d.backend} {holding or ''}"

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        h, d, holding = item
        p = ctx.palette
        stale = h.stale
        t_level: Level = "muted" if stale else temp_level(d.temp_c, d.slowdown_c)
        job: Part = ("stale", p.of("warn")) if stale else ((holding or "idle")[:8], p.muted)
        return (
            (h.hostname, None),
            (str(d.index), None),
            (d.short_name, None),
            _util_cell(d.util_pct, p),
            (mem_pair(d.mem_used_bytes, d.mem_total_bytes), p.of(load_level(d.mem_frac))),
            (temp(d.temp_c), p.of(t_level)),
            (watts(d.power_mw, d.power_limit_mw), None),
            job,
        )

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


class JobRow(NamedTuple):
    """A job's row item: the job, and when the policy (or the job itself) says it should start
    and end."""

    job: JobView
    times: JobTimes


def _soon(seconds: float | None) -> str:
    """``~12m`` from now; ``now`` for what is due; ``-`` when not predicted."""
    if seconds is None:
        return "-"
    return "now" if seconds < 1 else f"~{duration(seconds)}"


def job_hosts(job: JobView, snapshot: MeshSnapshot, width: int) -> str:
    """Where a job runs, in a cell ``width`` wide: its host, or a gang's first host and how
    many more (``h100-00 +1``, the host name cut so the count always shows); ``-`` before it is
    placed."""
    placed = job.placed()
    if not placed:
        return "-"
    first = snapshot.hostname(placed[0][0])
    if len(placed) == 1:
        return first
    more = f" +{len(placed) - 1}"
    return clip(first, max(1, width - len(more))) + more


def job_gpus(job: JobView) -> str:
    """GPUs per node, times the nodes of a gang (``2x4``); an elastic job's held and its range
    (``3 (2-4)``)."""
    if job.gpus_max_per_node is not None:
        span = f"({job.gpus_per_node}-{job.gpus_max_per_node})"
        return f"{len(job.devices)} {span}" if job.devices else span
    return f"{job.gpus_per_node}x{job.nodes}" if job.nodes > 1 else str(job.gpus_per_node)


class JobsTable(MeshTable):
    view_name = "jobs"
    COLUMNS = (
        Column("job", "Job", 8),
        Column("state", "State", 9),
        Column("node", "Node", 12, grow=8),
        Column("gpus", "GPU", 4, right=True),
        Column("progress", "Done", 4, right=True),
        Column("starts", "Start", 5, right=True),
        Column("ends", "End", 5, right=True),
        Column("why", "Command / why", 12, stretch=True),
    )
    SORTS: ClassVar[Mapping[str, SortSpec]] = {
        "name": (lambda r: r.job.job_id, False),
        "util": (lambda r: _nz(r.job.progress), True),
        "mem": (lambda r: r.job.gpus_per_node * r.job.nodes, True),
        "temp": (lambda r: _inf(r.times.ends_in_s), False),
    }
    """For jobs: N by id, U by progress, M by GPUs asked, T by predicted completion."""

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        scope = ctx.scope
        snapshot = ctx.snapshot
        jobs: Iterable[JobView] = snapshot.jobs
        if scope.node_id is not None:
            jobs = snapshot.jobs_on(scope.node_id, scope.device_key)
        for j in jobs:
            yield j.job_id, JobRow(j, snapshot.times(j))

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        j: JobView = item.job
        snapshot = ctx.snapshot
        hosts = " ".join(snapshot.hostname(node) for node, _ in j.placed())
        why = snapshot.why_waiting(j) or ""
        return f"{j.job_id} {j.state} {j.kind} {hosts} {j.command} {why}"

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        j: JobView = item.job
        times: JobTimes = item.times
        p = ctx.palette
        snapshot = ctx.snapshot
        why: Part
        waiting = snapshot.why_waiting(j)
        if waiting:
            why = (waiting, p.of("warn"))
        elif j.state == "failed" and j.exit_code is not None:
            why = (f"exit {j.exit_code}: {j.command}", p.of("bad"))
        else:
            why = (j.command, p.muted)
        return (
            (j.job_id[:8], None),
            (j.state, p.of(state_level(j.state))),
            (
                job_hosts(
                    j, snapshot, self._column_widths(self.scrollable_content_region.width)[2]
                ),
                None,
            ),
            (job_gpus(j), None),
            ("-" if j.progress is None else f"{100 * j.progress:.0f}%", None),
            (_soon(times.starts_in_s), None),
            (_soon(times.ends_in_s), None),
            why,
        )

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        job = snapshot.job(key)
        if job is None:
            return None
        return Selection("job", node_id=job.runner, job_id=key, raw=job.raw, title=key[:8])


def _inf(value: float | None) -> float:
    return float("inf") if value is None else value


class EventsTable(MeshTable):
    view_name = "events"
    COLUMNS = (
        Column("age", "Age", 5, right=True),
        Column("kind", "Kind", 10),
        Column("node", "Node", 14),
        Column("job", "Job", 8),
        Column("message", "Message", 30, stretch=True),
    )
    SORTS: ClassVar[Mapping[str, SortSpec]] = {"name": (lambda e: e.seq, True)}
    MAX_EVENTS: ClassVar[int] = 2000

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        node_id = ctx.scope.node_id
        for e in reversed(ctx.snapshot.events[-self.MAX_EVENTS :]):
            if node_id is None or e.node == node_id:
                yield str(e.seq), e

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        e: EventView = item
        node = ctx.snapshot.hostname(e.node) if e.node else "-"
        return f"{e.kind} {node} {e.job_id or ''} {e.message}"

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        e: EventView = item
        snapshot = ctx.snapshot
        return (
            (duration(snapshot.taken_at - e.at), None),
            (e.kind, None),
            (snapshot.hostname(e.node) if e.node else "-", None),
            ((e.job_id or "-")[:8], None),
            (e.message, None),
        )

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
