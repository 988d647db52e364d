"""A job's logs, streamed as the agent sends them (``l`` or ``:logs JOB``)."""

from __future__ import annotations

from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Label, Log

from agent.operator.client import ApiError
from tui.source import MeshSource
from tui.widgets.footer import KeyFooter


class LogsScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "close", "Back", id="logs.close"),
        Binding("f", "toggle_follow", "Follow", id="logs.follow"),
        Binding("g", "top", "Top", show=False, id="table.top"),
        Binding("G", "bottom", "Bottom", show=False, id="table.bottom"),
    ]

    def __init__(self, source: MeshSource, job_id: str, title: str) -> None:
        super().__init__()
        self.source = source
        self.job_id = job_id
        self.title_text = title
        self.lines_seen = 0

    def compose(self) -> ComposeResult:
        yield Label(f"logs {self.title_text}  (following)", id="logs-title")
        yield Log(id="log", highlight=False, auto_scroll=True)
        yield KeyFooter()

    def on_mount(self) -> None:
        self.stream()

    @work(exclusive=True, group="logs")
    async def stream(self) -> None:
        log = self.query_one("#log", Log)
        try:
            async for line in self.source.logs(self.job_id, lines=500, follow=True):
                log.write_line(line)
                self.lines_seen += 1
        except ApiError as exc:
            log.write_line(f"[logs unavailable: {exc}]")
            return
        log.write_line("[end of log]")

    def action_close(self) -> None:
        self.dismiss(None)

    def action_toggle_follow(self) -> None:
        log = self.query_one("#log", Log)
        log.auto_scroll = not log.auto_scroll
        state = "following" if log.auto_scroll else "paused"
        self.query_one("#logs-title", Label).update(f"logs {self.title_text}  ({state})")

    def action_top(self) -> None:
        self.query_one("#log", Log).scroll_home(animate=False)

    def action_bottom(self) -> None:
        self.query_one("#log", Log).scroll_end(animate=False)
