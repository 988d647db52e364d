"""The topology view: hosts grouped by vendor, OS or zone, every GPU with bars and history.

It is a line-API scroll view: only the lines on screen are drawn, so 1,000 hosts with 8,000 GPUs
cost what 40 lines cost. Each GPU line shows utilization, memory and temperature bars (eighth
blocks, or ASCII), a sparkline of the last ~10 minutes of utilization, and the job holding it.
A host that stopped reporting keeps its last values, drawn muted and marked stale with its age.
"""

from __future__ import annotations

from typing import ClassVar, Literal, NamedTuple

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tui.model import DeviceView, HostView
from tui.widgets.base import Drill, Selection, SortKey, ViewContext
from tui.widgets.render import (
    Level,
    bandwidth,
    bar_text,
    clip,
    duration,
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


class TopoRow(NamedTuple):
    """One line of the view (a tuple: thousands are made per refresh)."""

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


class TopologyView(ScrollView, can_focus=True):
    """Hosts and their GPUs, grouped; a cursor line; drill with enter."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j,down", "cursor(1)", "Down", show=False, id="table.down"),
        Binding("k,up", "cursor(-1)", "Up", show=False, id="table.up"),
        Binding("g,home", "top", "Top", show=False, id="table.top"),
        Binding("G,end", "bottom", "Bottom", show=False, id="table.bottom"),
        Binding("pagedown", "page(1)", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("enter", "drill", "Drill", show=False, id="table.drill"),
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
        self._rows: list[TopoRow] = []
        self._cursor = 0
        self._cursor_key: str | None = None
        self._strips: dict[tuple[int, int], Strip] = {}
        """Rendered lines by (row, width), without the cursor; dropped on every apply."""

    # -- data --------------------------------------------------------------------------------

    def apply(self, ctx: ViewContext) -> None:
        self._ctx = ctx
        snapshot = ctx.snapshot
        pattern = ctx.row_filter.compile()
        holder: dict[tuple[str, str], str] = {}
        for job in snapshot.jobs:
            if job.live and job.runner is not None:
                for key in job.devices:
                    holder[(job.runner, key)] = job.job_id
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
        rows: list[TopoRow] = []
        for title in sorted(groups):
            hosts = self._sorted(groups[title])
            gpus = sum(len(h.devices) for h in hosts)
            rows.append(
                TopoRow(
                    "group",
                    f"group:{title}",
                    f"{title} · {len(hosts)} host{'s' * (len(hosts) != 1)} · {gpus} GPUs",
                )
            )
            for host in hosts:
                rows.append(TopoRow("host", host.node_id, host=host))
                node_id = host.node_id
                rows.extend(
                    TopoRow("gpu", d.row_key, "", host, d, holder.get((node_id, d.key)))
                    for d in host.devices
                )
        self._rows = rows
        self._strips.clear()
        self._restore_cursor()
        self.virtual_size = Size(self.scrollable_content_region.width, len(rows))
        self.refresh()

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

    def _restore_cursor(self) -> None:
        if self._cursor_key is not None:
            for i, row in enumerate(self._rows):
                if row.key == self._cursor_key:
                    self._cursor = i
                    return
        self._cursor = min(self._cursor, max(0, len(self._rows) - 1))
        if self._rows:
            self._cursor_key = self._rows[self._cursor].key

    def sort_by(self, sort_key: SortKey) -> bool:
        self.sort_key = sort_key
        self.apply(self._ctx)
        return True

    # -- selection ---------------------------------------------------------------------------

    def selection(self) -> Selection | None:
        if not self._rows:
            return None
        row = self._rows[self._cursor]
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
        for i, row in enumerate(self._rows):
            if row.key == key:
                self._move_to(i)
                return True
        return False

    def _move_to(self, index: int) -> None:
        if not self._rows:
            return
        index = max(0, min(len(self._rows) - 1, index))
        old, self._cursor = self._cursor, index
        self._cursor_key = self._rows[index].key
        height = self.scrollable_content_region.height or 1
        top = int(self.scroll_offset.y)
        if index < top:
            self.scroll_to(y=index, animate=False)
            self.refresh()
        elif index >= top + height:
            self.scroll_to(y=index - height + 1, animate=False)
            self.refresh()
        else:
            self.refresh_line(old)
            self.refresh_line(index)

    @property
    def cursor_row(self) -> int:
        return self._cursor

    def action_cursor(self, delta: int) -> None:
        self._move_to(self._cursor + delta)

    def action_page(self, direction: int) -> None:
        self._move_to(self._cursor + direction * max(1, self.scrollable_content_region.height - 1))

    def action_top(self) -> None:
        self._move_to(0)

    def action_bottom(self) -> None:
        self._move_to(len(self._rows) - 1)

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

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    def render_line(self, y: int) -> Strip:
        index = int(self.scroll_offset.y) + y
        width = self.scrollable_content_region.width
        if index >= len(self._rows):
            return Strip.blank(width, self.rich_style)
        strip = self._strips.get((index, width))
        if strip is None:
            strip = self._render_row(self._rows[index], width)
            self._strips[(index, width)] = strip
        if index == self._cursor:
            cursor = self._ctx.palette.selected if self.has_focus else Style(underline=True)
            strip = strip.apply_style(cursor)
        return strip

    def _render_row(self, row: TopoRow, width: int) -> Strip:
        if row.kind == "group":
            text = self._group_line(row)
        elif row.kind == "host":
            assert row.host is not None
            text = self._host_line(row.host, width)
        else:
            assert row.host is not None and row.device is not None
            text = self._gpu_line(row.host, row.device, row.job_id, width)
        text.truncate(width, pad=True)
        base = self.rich_style
        segments = [
            Segment(seg.text, base + seg.style if seg.style else base)
            for seg in text.render(self.app.console)
            if seg.text
        ]
        return Strip(segments, width)

    def _group_line(self, row: TopoRow) -> Text:
        p = self._ctx.palette
        return Text(f"▾ {row.label}" if not self._ctx.glyphs.ascii else f"v {row.label}", p.group)

    def _host_line(self, host: HostView, width: int) -> Text:
        p = self._ctx.palette
        text = Text(no_wrap=True, end="")
        text.append(" ")
        text.append(clip(host.hostname, 20).ljust(20), p.accent)
        text.append(" ")
        text.append(host.state.ljust(7), p.of(state_level(host.state)))
        text.append(" ")
        text.append(host.drain.ljust(11), p.of(state_level(host.drain)))
        if host.stale:
            age = duration(host.telemetry_age_s) if host.telemetry_age_s is not None else "?"
            text.append(f" stale {age} ", p.of("bad" if host.state == "dead" else "warn"))
        text.append(f" {host.zone}", p.muted)
        links = _links_summary(host)
        if links:
            text.append(f"  {links}", p.muted)
        jobs = len(host.running_jobs)
        if jobs:
            text.append(f"  {jobs} job{'s' * (jobs != 1)}", p.muted)
        if host.queue:
            text.append(f" q{host.queue}", p.of("warn"))
        return text

    def _gpu_line(self, host: HostView, d: DeviceView, job_id: str | None, width: int) -> Text:
        p = self._ctx.palette
        g = self._ctx.glyphs
        stale = host.stale
        fixed = 4 + 3 + 13 + 5 + 1 + 9 + 1 + 6 + 9
        avail = max(0, width - fixed)
        bars = min(int(avail * 0.65), 48)
        util_w, mem_w = max(3, bars * 9 // 20), max(2, bars * 7 // 20)
        temp_w = max(1, bars - util_w - mem_w)
        spark_w = max(0, avail - bars - 1)
        text = Text(no_wrap=True, end="")
        text.append(f"    {d.index:>2} ")
        text.append(clip(d.short_name, 12).ljust(13), p.muted if stale else Style())
        util_frac = None if d.util_pct is None else d.util_pct / 100.0
        u_level: Level = "muted" if stale else load_level(util_frac)
        m_level: Level = "muted" if stale else load_level(d.mem_frac)
        t_level: Level = "muted" if stale else temp_level(d.temp_c, d.slowdown_c)
        text.append_text(bar_text(util_frac, util_w, g, p, u_level))
        text.append(f"{pct(d.util_pct):>5} ", p.of(u_level))
        text.append_text(bar_text(d.mem_frac, mem_w, g, p, m_level))
        text.append(f"{mem_pair(d.mem_used_bytes, d.mem_total_bytes):>9} ", p.of(m_level))
        t_frac = None
        if d.temp_c is not None and d.slowdown_c:
            t_frac = d.temp_c / d.slowdown_c
        text.append_text(bar_text(t_frac, temp_w, g, p, t_level))
        text.append(f"{temp(d.temp_c):>6}", p.of(t_level))
        history = self._ctx.history
        series = history.series(d.row_key) if history is not None else ()
        if spark_w:
            text.append(" ")
            text.append(g.spark(series, spark_w), p.muted if stale else p.of("ok"))
        if stale:
            text.append("  stale", p.of("warn"))
        elif job_id is not None:
            text.append(f"  {job_id[:7]}", p.accent)
        else:
            text.append("  idle", p.muted)
        return text
