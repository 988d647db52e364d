"""The fleet's history (``F``): GPU utilization (busy and allocated) by vendor and by model, and
the GPU-hours left idle while jobs waited, over 5 minutes, an hour, a day or a week (``1``-``4``),
read from every node's own history (:mod:`agent.operator.fleet_read`), drawn as
``shoal history --fleet`` draws it (:mod:`agent.cli.fleet_view`)."""

from __future__ import annotations

from typing import cast

from rich.style import Style
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Label, Static

from agent.cli.fleet_view import fleet_rows
from agent.operator.client import ApiError
from agent.operator.fleet_read import FleetReport, read_fleet
from agent.wire.codec import WireError
from tui.context import ShoalContext
from tui.screens.history import WindowScreen
from tui.source import MeshSource
from tui.widgets.footer import KeyFooter


class FleetScreen(WindowScreen):
    def __init__(self, source: MeshSource, *, ascii: bool) -> None:
        super().__init__()
        self.source = source
        self.ascii = ascii
        self.report: FleetReport | None = None
        """The last report shown (tests wait on it)."""

    def compose(self) -> ComposeResult:
        yield Label("", id="fleet-title")
        with VerticalScroll(id="fleet-body"):
            yield Static("reading every node's history…", id="fleet-chart")
        yield KeyFooter()

    def _title(self) -> str:
        read = ""
        if self.report is not None and self.report.span_s == self.span_s:
            r = self.report
            read = f"   {r.nodes_read} nodes answered, every {r.grid.step_s}s"
        return f"fleet history, {self.picks()}{read}"

    @work(exclusive=True, group="fleet")
    async def load(self) -> None:
        self.query_one("#fleet-title", Label).update(self._title())
        try:
            report = await read_fleet(self.source, self.span_s)
        except (ApiError, WireError, OSError) as exc:
            self.query_one("#fleet-chart", Static).update(Text(f"fleet history unavailable: {exc}"))
            return
        self.report = report
        self.query_one("#fleet-title", Label).update(self._title())
        self._draw()

    def _draw(self) -> None:
        if self.report is None:
            return
        palette = cast(ShoalContext, self.app).palette
        styles = {
            "title": palette.accent,
            "busy": palette.ok,
            "alloc": palette.group,
            "idle": palette.warn,
            "muted": palette.muted,
            "value": Style(bold=True),
        }
        text = Text()
        rows = fleet_rows(self.report, max(40, self.size.width - 2), ascii_only=self.ascii)
        for n, row in enumerate(rows):
            if n:
                text.append("\n")
            for part, role in row:
                # leading spaces a run of their own: a screenshot's SVG drops them from a run
                body = part.lstrip(" ")
                text.append(part[: len(part) - len(body)])
                text.append(body, styles.get(role, ""))
        self.query_one("#fleet-chart", Static).update(text)
