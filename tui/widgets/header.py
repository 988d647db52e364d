"""The header: the mesh's name, who we are, the connection, the view and what is running."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tui.model import MeshSnapshot
from tui.source import Identity
from tui.widgets.render import DEFAULT_PALETTE, Palette, duration

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class MeshHeader(Widget):
    """Two lines, always visible: identity and connection; view, counts, filter, operations."""

    DEFAULT_CSS = """
    MeshHeader { height: 2; background: $panel; color: $text; padding: 0 1; }
    """

    view_label: reactive[str] = reactive("topology")
    filter_text: reactive[str] = reactive("")
    connection: reactive[str] = reactive("connecting")
    error: reactive[str] = reactive("")
    busy: reactive[str] = reactive("")
    readonly: reactive[bool] = reactive(False)

    def __init__(self, identity: Identity, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.identity = identity
        self.snapshot: MeshSnapshot | None = None
        self.palette: Palette = DEFAULT_PALETTE
        self.connected_at: float | None = None

    def update_snapshot(self, snapshot: MeshSnapshot) -> None:
        self.snapshot = snapshot
        self.refresh()

    def render(self) -> Text:
        p = self.palette
        me = self.identity
        line = Text(no_wrap=True, overflow="ellipsis", end="")
        line.append("shoal ", p.accent)
        line.append(me.mesh_name, p.group)
        line.append(f"  me {me.node_id[:10]} ({me.role}{', read-only' if self.readonly else ''})")
        line.append(f"  via {me.address}  ", p.muted)
        level = {"connected": "ok", "connecting": "warn"}.get(self.connection, "bad")
        dot = "●" if self.connection == "connected" else "○"
        line.append(f"{dot} {self.connection}", p.of(level))  # type: ignore[arg-type]
        if self.error:
            line.append(f": {self.error}", p.of("bad"))
        second = Text(no_wrap=True, overflow="ellipsis", end="")
        second.append(f"<{self.view_label}>", p.accent)
        s = self.snapshot
        if s is not None:
            hosts = len(s.hosts)
            alive = sum(1 for h in s.hosts if h.state == "alive")
            gpus = sum(  # of live hosts, and a host's CPU is no GPU
                1 for h in s.hosts if h.state == "alive" for d in h.devices if d.backend != "cpu"
            )
            running = sum(1 for j in s.jobs if j.state == "running")
            pending = sum(1 for j in s.jobs if j.state == "pending")
            second.append(
                f"  {alive}/{hosts} host{'s' * (hosts != 1)}  {gpus} GPU{'s' * (gpus != 1)}"
                f"  {running} running"
            )
            if pending:
                second.append(f"  {pending} pending", p.of("warn"))
        if self.filter_text:
            second.append(f"  /{self.filter_text}", p.of("warn"))
        if self.busy:
            second.append(f"  {self.busy}", p.of("warn"))
        if self.connection != "connected" and s is not None and s.taken_at and self.connected_at:
            second.append(f"  last data {duration(self.connected_at)} old", p.of("warn"))
        return Text("\n").join([line, second])
