"""A GPU's, a host's or a job's history (``h``), read from its node's ``GET /v1/history`` and
charted as ``shoal history`` charts it; ``1``-``4`` switch between 5 minutes, an hour, a day and
a week."""

from __future__ import annotations

from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Label, Static

from agent.cli.history_cmd import chart_lines
from agent.operator.client import ApiError
from agent.wire.codec import WireError
from agent.wire.history import HistoryDoc
from tui.history import WINDOWS, HistoryTarget, history_query, padded
from tui.source import MeshSource
from tui.widgets.footer import KeyFooter


class WindowScreen(Screen[None]):
    """A chart over one of :data:`WINDOWS` (``1``-``4``), read again on each switch: the
    history panel and the fleet view."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "close", "Back", id="history.close"),
        Binding("1", "window(0)", "5m", id="history.5m"),
        Binding("2", "window(1)", "1h", id="history.1h"),
        Binding("3", "window(2)", "24h", id="history.24h"),
        Binding("4", "window(3)", "7d", id="history.7d"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.window = 1

    @property
    def span_s(self) -> int:
        """The window shown (or being read)."""
        return WINDOWS[self.window][1]

    def picks(self) -> str:
        """``last 1h   5m  [1h]  24h  7d``."""
        name = WINDOWS[self.window][0]
        keys = "  ".join(f"[{w}]" if i == self.window else w for i, (w, _) in enumerate(WINDOWS))
        return f"last {name}   {keys}"

    def on_mount(self) -> None:
        self.load()

    def on_resize(self) -> None:
        self._draw()

    def action_close(self) -> None:
        self.dismiss(None)

    def action_window(self, index: int) -> None:
        self.window = index
        self.load()

    def load(self) -> object:
        """Read the window's data (a worker) and draw it."""
        raise NotImplementedError

    def _draw(self) -> None:
        raise NotImplementedError


class HistoryScreen(WindowScreen):
    def __init__(self, source: MeshSource, target: HistoryTarget, *, ascii: bool) -> None:
        super().__init__()
        self.source = source
        self.target = target
        self.ascii = ascii
        self.doc: HistoryDoc | None = None
        """The last answer shown (tests wait on it)."""

    def compose(self) -> ComposeResult:
        yield Label("", id="history-title")
        yield Static("reading…", id="history-chart")
        yield KeyFooter()

    def _title(self) -> str:
        return f"history {self.target.subject} {self.target.label}, {self.picks()}"

    @work(exclusive=True, group="history")
    async def load(self) -> None:
        self.query_one("#history-title", Label).update(self._title())
        span_s = WINDOWS[self.window][1]
        query = history_query(self.target, span_s, self.source.now())
        try:
            doc = await self.source.history(query, self.target.address)
        except (ApiError, WireError, OSError) as exc:
            self.query_one("#history-chart", Static).update(f"history unavailable: {exc}")
            return
        self.doc = doc
        self._draw()

    def _draw(self) -> None:
        if self.doc is None:
            return
        width = max(20, self.size.width - 2)
        lines = chart_lines(padded(self.doc), width, ascii_only=self.ascii)
        self.query_one("#history-chart", Static).update("\n".join(lines))
