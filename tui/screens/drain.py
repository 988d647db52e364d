"""Drain a host: confirm, with a grace period for the jobs running there."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from agent.job.units import parse_duration
from tui.model import HostView, JobView


class DrainScreen(ModalScreen[float | None]):
    """Answers the grace period in seconds, or None when the operator backs out."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="dialog.cancel"),
    ]

    def __init__(self, host: HostView, jobs: list[JobView], default_grace: str = "5m") -> None:
        super().__init__()
        self.host = host
        self.jobs = jobs
        self.default_grace = default_grace

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="drain"):
            yield Label(f"Drain {self.host.hostname}?", classes="title")
            if self.jobs:
                names = ", ".join(j.job_id[:8] for j in self.jobs[:6])
                more = f" and {len(self.jobs) - 6} more" if len(self.jobs) > 6 else ""
                text = (
                    f"No new jobs will be placed there. {len(self.jobs)} running job(s) "
                    f"({names}{more}) get the grace period to finish, then move elsewhere."
                )
            else:
                text = "No new jobs will be placed there. Nothing runs there now."
            yield Static(text, classes="explain")
            with Horizontal(classes="field"):
                yield Label("Grace period ")
                yield Input(self.default_grace, placeholder="e.g. 5m, 1h, 90s", id="grace")
            yield Label("", id="drain-error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("Drain (enter)", variant="error", id="yes")
                yield Button("Cancel (esc)", id="no")

    def on_mount(self) -> None:
        self.query_one("#grace", Input).focus()

    def _confirm(self) -> None:
        text = self.query_one("#grace", Input).value.strip() or "0"
        try:
            grace = parse_duration(text)
        except ValueError as exc:
            self.query_one("#drain-error", Label).update(str(exc))
            return
        self.dismiss(grace)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._confirm()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "yes":
            self._confirm()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
