"""The topology view: hosts grouped by vendor, OS or zone, every GPU with bars and history.

It is a line-API scroll view: only the lines on screen are drawn, so 1,000 hosts with 8,000 GPUs
cost what 40 lines cost. Each GPU line shows utilization, memory and temperature bars (eighth
blocks, or ASCII), a sparkline of the last ~10 minutes of utilization, and the job holding it.
A host that stopped reporting keeps its last values, drawn muted and marked stale with its age.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace
from typing import ClassVar, Literal, NamedTuple

from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tui.model import EMPTY_SNAPSHOT, DeviceView, HostView
from tui.widgets.base import CURSOR_BINDINGS, CursorKeys, Drill, Selection, SortKey, ViewContext
from tui.widgets.render import (
    Level,
    Part,
    bandwidth,
    bar_parts,
    clip,
    duration,
    line_strip,
    load_level,
    mem_pair,
    pct,
    state_level,
    temp,
    temp_level,
)

GroupBy = Literal["vendor", "os", "zone"]
GROUPINGS: tuple[GroupBy, ...] = ("vendor", "os", "zone")
VENDOR_TITLES = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel", "apple": "Apple"}


Entry = tuple[str, HostView | None]
"""A group title (``(title, None)``) or a host (``("", host)``): a host's GPUs are the lines
under it, so a refresh makes one entry per host, not one per GPU."""


class TopoRow(NamedTuple):
    """One line of the view, made when a line is asked for."""

    kind: Literal["group", "host", "gpu"]
    key: str
    label: str = ""
    host: HostView | None = None
    device: DeviceView | None = None
    job_id: str | None = None


def _group_of(host: HostView, group_by: GroupBy) -> str:
    if group_by == "os":
        return f"{host.os or 'unknown OS'} {host.arch or ''}".strip()
    if group_by == "zone":
        return host.zone
    return " + ".join(VENDOR_TITLES.get(v, v) for v in host.vendor.split("+"))


def _links_summary(host: HostView) -> str:
    linked = [d for d in host.devices if d.links]
    if not linked:
        return "pcie" if len(host.devices) > 1 else ""
    kinds = sorted({link.kind for d in linked for link in d.links})
    best = max((link.bandwidth_mbps or 0) for d in linked for link in d.links)
    return f"{'/'.join(kinds)} x{len(linked)} {bandwidth(best or None)}"


class TopologyView(CursorKeys, ScrollView, can_focus=True):
    """Hosts and their GPUs, grouped; a cursor line; drill with enter."""

    BINDINGS: ClassVar[list[BindingType]] = [
        *CURSOR_BINDINGS,
        Binding("z", "regroup", "Group", id="topology.group"),
    ]

    DEFAULT_CSS = """
    TopologyView { height: 1fr; overflow-x: hidden; }
    """

    view_name: ClassVar[str] = "topology"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.group_by: GroupBy = "vendor"
        self.sort_key: SortKey = "name"
        self._ctx = ViewContext()
        self._entries: list[Entry] = []
        self._starts: list[int] = []
        """The line each entry starts on."""
        self._group_sizes: dict[str, tuple[int, int]] = {}
        self._host_entry: dict[str, int] = {}
        self._lines = 0
        self._cursor = 0
        self._cursor_key: str | None = None
        self._base: Style | None = None
        self._strips: dict[tuple[int, int], Strip] = {}
        """Rendered lines by (line, width), without the cursor; dropped on every apply."""

    # -- data --------------------------------------------------------------------------------

    def apply(self, ctx: ViewContext) -> None:
        self._ctx = ctx
        snapshot = ctx.snapshot
        pattern = ctx.row_filter.compile()
        groups: dict[str, list[HostView]] = {}
        for host in snapshot.hosts:
            if pattern is not None:
                haystack = (
                    f"{host.hostname} {host.node_id} {host.vendor} {host.zone} {host.os} "
                    f"{host.state} {host.drain} {' '.join(d.name for d in host.devices[:1])}"
                )
                if not ctx.row_filter.keeps(haystack, pattern):
                    continue
            groups.setdefault(_group_of(host, self.group_by), []).append(host)
        entries: list[Entry] = []
        starts: list[int] = []
        sizes: dict[str, tuple[int, int]] = {}
        host_entry: dict[str, int] = {}
        line = 0
        for title in sorted(groups):
            hosts = self._sorted(groups[title])
            sizes[title] = (len(hosts), sum(len(h.devices) for h in hosts))
            entries.append((title, None))
            starts.append(line)
            line += 1
            for host in hosts:
                host_entry[host.node_id] = len(entries)
                entries.append(("", host))
                starts.append(line)
                line += 1 + len(host.devices)
        self._entries, self._starts, self._group_sizes = entries, starts, sizes
        self._host_entry, self._lines = host_entry, line
        self._strips.clear()
        self._base = None
        self._restore_cursor()
        self.virtual_size = Size(self.scrollable_content_region.width, line)
        self.refresh()

    def release(self) -> None:
        """Drop the lines (hidden and out of date: the snapshot they hold can be freed)."""
        self._ctx = replace(self._ctx, snapshot=EMPTY_SNAPSHOT)
        self._entries, self._starts, self._group_sizes, self._host_entry = [], [], {}, {}
        self._lines = 0
        self._strips.clear()

    def _sorted(self, hosts: list[HostView]) -> list[HostView]:
        key = self.sort_key
        if key == "util":
            return sorted(hosts, key=lambda h: -(h.util_pct or -1.0))
        if key == "mem":
            return sorted(
                hosts,
                key=lambda h: -((h.mem_used_bytes or 0) / (h.gpu_mem_total_bytes or 1)),
            )
        if key == "temp":
            return sorted(hosts, key=lambda h: -(h.temp_c or -1.0))
        return sorted(hosts, key=lambda h: h.hostname)

    def row(self, line: int) -> TopoRow:
        """What is on virtual line ``line`` (``0 <= line < line_count``)."""
        i = bisect_right(self._starts, line) - 1
        title, host = self._entries[i]
        if host is None:
            n_hosts, n_gpus = self._group_sizes[title]
            label = (
                f"{title} · {n_hosts} host{'s' * (n_hosts != 1)}"
                f" · {n_gpus} GPU{'s' * (n_gpus != 1)}"
            )
            return TopoRow("group", f"group:{title}", label)
        offset = line - self._starts[i]
        if offset == 0:
            return TopoRow("host", host.node_id, host=host)
        d = host.devices[offset - 1]
        job_id = self._ctx.snapshot.holders().get((host.node_id, d.key))
        return TopoRow("gpu", d.row_key, "", host, d, job_id)

    @property
    def line_count(self) -> int:
        return self._lines

    def line_of(self, key: str) -> int | None:
        """The line showing ``key`` (a node id, ``node/device`` or ``group:title``)."""
        if key.startswith("group:"):
            for start, (title, host) in zip(self._starts, self._entries, strict=True):
                if host is None and f"group:{title}" == key:
                    return start
            return None
        node_id, _, device_key = key.partition("/")
        i = self._host_entry.get(node_id)
        if i is None:
            return None
        host = self._entries[i][1]
        assert host is not None
        if not device_key:
            return self._starts[i]
        for n, d in enumerate(host.devices):
            if d.key == device_key:
                return self._starts[i] + 1 + n
        return None

    def _restore_cursor(self) -> None:
        if self._cursor_key is not None:
            line = self.line_of(self._cursor_key)
            if line is not None:
                self._cursor = line
                return
        self._cursor = min(self._cursor, max(0, self._lines - 1))
        if self._lines:
            self._cursor_key = self.row(self._cursor).key

    def sort_by(self, sort_key: SortKey) -> bool:
        self.sort_key = sort_key
        self.apply(self._ctx)
        return True

    # -- selection ---------------------------------------------------------------------------

    def selection(self) -> Selection | None:
        if not self._lines:
            return None
        row = self.row(self._cursor)
        if row.kind == "gpu" and row.host is not None and row.device is not None:
            return Selection(
                "gpu",
                node_id=row.host.node_id,
                device_key=row.device.key,
                job_id=row.job_id,
                raw=row.device.raw,
                title=f"{row.host.hostname} GPU {row.device.index}",
            )
        if row.kind == "host" and row.host is not None:
            return Selection(
                "host", node_id=row.host.node_id, raw=row.host.raw, title=row.host.hostname
            )
        return None

    def select_key(self, key: str) -> bool:
        line = self.line_of(key)
        if line is None:
            return False
        self._move_to(line)
        return True

    def _move_to(self, index: int) -> None:
        if not self._lines:
            return
        index = max(0, min(self._lines - 1, index))
        old, self._cursor = self._cursor, index
        self._cursor_key = self.row(index).key
        height = self.scrollable_content_region.height or 1
        top = int(self.scroll_offset.y)
        if index < top:
            self.scroll_to(y=index, animate=False, immediate=True)
            self.refresh()
        elif index >= top + height:
            self.scroll_to(y=index - height + 1, animate=False, immediate=True)
            self.refresh()
        else:
            self.refresh_line(old)
            self.refresh_line(index)

    @property
    def cursor_row(self) -> int:
        return self._cursor

    def _cursor_lines(self) -> int:
        return self._lines

    def _page_rows(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    def action_drill(self) -> None:
        selection = self.selection()
        if selection is not None:
            self.post_message(Drill(selection))

    def action_regroup(self) -> None:
        self.group_by = GROUPINGS[(GROUPINGS.index(self.group_by) + 1) % len(GROUPINGS)]
        self.apply(self._ctx)
        self.notify(f"topology grouped by {self.group_by}", timeout=2)

    def on_click(self, event: events.Click) -> None:
        self._move_to(int(self.scroll_offset.y) + event.y)

    # -- drawing -----------------------------------------------------------------------------

    def _base_style(self) -> Style:
        """The widget's own style under every line (asked of the DOM once, not per line)."""
        if self._base is None:
            self._base = self.rich_style
        return self._base

    def notify_style_update(self) -> None:
        self._base = None
        super().notify_style_update()

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    def render_line(self, y: int) -> Strip:
        index = int(self.scroll_offset.y) + y
        width = self.scrollable_content_region.width
        if index >= self._lines:
            return Strip.blank(width, self._base_style())
        base = self._base_style()
        if index == self._cursor:
            cursor = self._ctx.palette.selected if self.has_focus else Style(underline=True)
            return self._render_row(self.row(index), width, base + cursor)
        strip = self._strips.get((index, width))
        if strip is None:
            strip = self._render_row(self.row(index), width, base)
            self._strips[(index, width)] = strip
        return strip

    def _render_row(self, row: TopoRow, width: int, base: Style) -> Strip:
        if row.kind == "group":
            parts = self._group_line(row)
        elif row.kind == "host":
            assert row.host is not None
            parts = self._host_line(row.host)
        else:
            assert row.host is not None and row.device is not None
            parts = self._gpu_line(row.host, row.device, row.job_id, width)
        return line_strip(parts, width, base)

    def _group_line(self, row: TopoRow) -> list[Part]:
        mark = "v" if self._ctx.glyphs.ascii else "▾"
        return [(f"{mark} {row.label}", self._ctx.palette.group)]

    def _host_line(self, host: HostView) -> list[Part]:
        p = self._ctx.palette
        parts: list[Part] = [
            (" ", None),
            (clip(host.hostname, 20).ljust(20), p.accent),
            (" ", None),
            (host.state.ljust(7), p.of(state_level(host.state))),
            (" ", None),
            (host.drain.ljust(11), p.of(state_level(host.drain))),
        ]
        if host.stale:
            age = duration(host.telemetry_age_s) if host.telemetry_age_s is not None else "?"
            parts.append((f" stale {age} ", p.of("bad" if host.state == "dead" else "warn")))
        parts.append((f" {host.zone}", p.muted))
        parts.append((f"  {host.platform}", p.muted))
        links = _links_summary(host)
        if links:
            parts.append((f"  {links}", p.muted))
        mig = host.mig_count
        if mig:
            parts.append((f"  MIG {mig}", p.muted))
        jobs = len(host.running_jobs)
        if jobs:
            parts.append((f"  {jobs} job{'s' * (jobs != 1)}", p.muted))
        if host.queue:
            parts.append((f" q{host.queue}", p.of("warn")))
        return parts

    def _gpu_line(
        self, host: HostView, d: DeviceView, job_id: str | None, width: int
    ) -> list[Part]:
        p = self._ctx.palette
        g = self._ctx.glyphs
        stale = host.stale
        fixed = 4 + 3 + 13 + 5 + 1 + 9 + 1 + 6 + 9
        avail = max(0, width - fixed)
        bars = min(int(avail * 0.65), 48)
        util_w, mem_w = max(3, bars * 9 // 20), max(2, bars * 7 // 20)
        temp_w = max(1, bars - util_w - mem_w)
        spark_w = max(0, avail - bars - 1)
        util_frac = None if d.util_pct is None else d.util_pct / 100.0
        u_level: Level = "muted" if stale else load_level(util_frac)
        m_level: Level = "muted" if stale else load_level(d.mem_frac)
        t_level: Level = "muted" if stale else temp_level(d.temp_c, d.slowdown_c)
        t_frac = None
        if d.temp_c is not None and d.slowdown_c:
            t_frac = d.temp_c / d.slowdown_c
        parts: list[Part] = [
            (f"    {d.index:>2} ", None),
            (clip(d.short_name, 12).ljust(13), p.muted if stale else None),
            *bar_parts(util_frac, util_w, g, p, u_level),
            (f"{pct(d.util_pct):>5} ", p.of(u_level)),
            *bar_parts(d.mem_frac, mem_w, g, p, m_level),
            (f"{mem_pair(d.mem_used_bytes, d.mem_total_bytes):>9} ", p.of(m_level)),
            *bar_parts(t_frac, temp_w, g, p, t_level),
            (f"{temp(d.temp_c):>6}", p.of(t_level)),
        ]
        if spark_w:
            history = self._ctx.history
            series = history.series(d.row_key) if history is not None else ()
            parts.append((" " + g.spark(series, spark_w), p.muted if stale else p.ok))
        if stale:
            parts.append(("  stale", p.of("warn")))
        elif job_id is not None:
            parts.append((f"  {job_id[:7]}", p.accent))
        else:
            parts.append(("  idle", p.muted))
        return parts
