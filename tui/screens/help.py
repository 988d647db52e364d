"""``?``: every key, with the id to rebind it in ~/.config/shoal/tui.toml [keymap]."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

HELP_ROWS: tuple[tuple[str, str, str, bool], ...] = (
    ("global", "shoal.command", "command bar (:hosts :gpus :jobs :events :logs JOB :q)", False),
    ("global", "shoal.filter", "filter rows (regex; a leading ! keeps what does not match)", False),
    ("global", "shoal.back", "back / clear the filter (never quits)", False),
    ("global", "shoal.help", "this help", False),
    ("global", "shoal.palette", "command palette", False),
    ("global", "shoal.quit", "quit", False),
    ("global", "shoal.next_view", "next view", False),
    ("views", "view.datasets", "datasets: versions, sizes, copies (also :data)", False),
    ("views", "view.usage", "usage: GPU-hours and energy (also :usage)", False),
    (
        "views",
        "view.fleet",
        "fleet: utilization by vendor and model, GPU-hours idle while jobs "
        "waited (also :fleet; 1-4: 5m 1h 24h 7d)",
        False,
    ),
    ("usage", "usage.by", "group by team, user, GPU model", False),
    ("usage", "usage.window", "window: 24h, 7d, 30d", False),
    ("tables", "table.down / table.up", "move", False),
    ("tables", "table.top / table.bottom", "first / last row", False),
    ("tables", "table.drill", "drill down: host -> GPUs -> jobs", False),
    ("tables", "sort.name/util/mem/temp", "sort by name, utilization, memory, temperature", False),
    ("topology", "topology.group", "group hosts by vendor, OS or zone", False),
    ("any row", "row.describe", "describe", False),
    ("any row", "row.json", "raw JSON", False),
    ("any row", "row.history", "history of a GPU, host or job (1-4: 5m 1h 24h 7d)", False),
    ("host", "host.cordon", "cordon (no new jobs)", True),
    ("host", "host.drain", "drain (confirm, grace period)", True),
    ("host", "host.undrain", "undrain (schedulable again)", True),
    ("host", "host.add", "add hosts over SSH, as shoal bootstrap (also :add USER@HOST ...)", True),
    ("job", "job.submit", "submit a job (form with placement preview)", True),
    ("job", "job.migrate", "migrate to a host that fits", True),
    ("job", "job.logs", "stream logs", False),
    ("job", "job.cancel", "cancel (confirm)", True),
)


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "close", "Close", id="dialog.close"),
    ]

    def __init__(
        self, keys: dict[str, str], readonly: bool, hidden: frozenset[str] = frozenset()
    ) -> None:
        super().__init__()
        self.keys = keys
        self.readonly = readonly
        self.hidden = hidden
        """Binding ids left out: keys this TUI cannot use (adding hosts without the CA)."""

    def compose(self) -> ComposeResult:
        # The scope heads its rows (as k9s's help does), so the action has the room to be read
        # on one line even at 80 columns.
        table = Table(box=None, padding=(0, 1), show_header=True, header_style="bold")
        table.add_column("key", no_wrap=True)
        table.add_column("action", ratio=1)
        table.add_column("binding id", style="dim", no_wrap=True)
        scope_shown = ""
        for scope, binding_id, text, mutating in HELP_ROWS:
            if (mutating and self.readonly) or binding_id in self.hidden:
                continue
            if scope != scope_shown:
                table.add_row(Text(scope, style="bold underline"), "", "")
                scope_shown = scope
            keys = " ".join(self.keys.get(part.strip(), "") for part in binding_id.split("/"))
            table.add_row(keys.strip() or "-", text, binding_id)
        with VerticalScroll(classes="dialog wide", id="help"):
            title = "Keys" + ("  (read-only: mutating keys are hidden)" if self.readonly else "")
            yield Label(title, classes="title")
            yield Static(table)

    def action_close(self) -> None:
        self.dismiss(None)
