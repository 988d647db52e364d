"""Submit a job through a form that previews where it would go before you confirm."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from agent.jobspec import BACKENDS, JOB_KINDS, JobSpec
from tui.model import MeshSnapshot
from tui.preview import offers
from tui.widgets.render import clip

FIELDS: tuple[tuple[str, str, str], ...] = (
    ("command", "Command", "python train.py --epochs 3"),
    ("gpus", "GPUs per node", "1"),
    ("memory", "Memory per GPU", "any, or e.g. 40GiB"),
    ("backends", "Backends", f"any, or some of {','.join(BACKENDS)}"),
    ("priority", "Priority", "0"),
    ("deadline", "Deadline", "none, or in e.g. 6h"),
    ("datasets", "Datasets", "none, or e.g. imagenet,laion"),
)


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.replace(" ", ",").split(",") if w.strip()]


def spec_from_form(values: dict[str, str], kind: str, now: float) -> JobSpec:
    """The job spec the form describes; ``ValueError`` (one line) when it is not valid."""
    try:
        command = shlex.split(values.get("command", ""))
    except ValueError as exc:
        raise ValueError(f"command: {exc}") from None
    if not command:
        raise ValueError("command: say what to run")
    gpus_text = values.get("gpus", "").strip() or "1"
    if not gpus_text.isdigit():
        raise ValueError(f"GPUs per node: {gpus_text!r} is not a whole number")
    priority_text = values.get("priority", "").strip() or "0"
    try:
        priority = int(priority_text)
    except ValueError:
        raise ValueError(f"priority: {priority_text!r} is not a whole number") from None
    resources: dict[str, Any] = {"gpus_per_node": int(gpus_text)}
    memory = values.get("memory", "").strip()
    if memory:
        resources["min_mem_per_gpu_bytes"] = memory
    backends = _words(values.get("backends", ""))
    if backends:
        resources["backends"] = backends
    data: dict[str, Any] = {
        "command": command,
        "kind": kind,
        "priority": priority,
        "resources": resources,
        "datasets": _words(values.get("datasets", "")),
    }
    deadline = values.get("deadline", "").strip()
    if deadline:
        data["deadline"] = deadline
    return JobSpec.from_human(data, now=now)


SUBMIT_CHROME_ROWS = 16
"""Rows of the dialog that are not fields: border, padding, title, preview, buttons."""


class SubmitScreen(ModalScreen[JobSpec | None]):
    """Answers the spec to submit, or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="dialog.cancel"),
        Binding("ctrl+s", "submit", "Submit", id="submit.confirm", priority=True),
    ]

    def __init__(
        self, snapshot: Callable[[], MeshSnapshot], now: Callable[[], float], command: str = ""
    ) -> None:
        super().__init__()
        self._snapshot = snapshot
        self._now = now
        self._command = command
        self.spec: JobSpec | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="submit"):
            yield Label("Submit a job", classes="title")
            with VerticalScroll(id="submit-fields"):
                for key, label, placeholder in FIELDS:
                    with Horizontal(classes="field"):
                        yield Label(f"{label:<15}")
                        value = self._command if key == "command" else ""
                        if key == "gpus":
                            value = "1"
                        yield Input(value, placeholder=placeholder, id=f"f-{key}")
                with Horizontal(classes="field"):
                    yield Label(f"{'Kind':<15}")
                    yield Select(
                        [(k, k) for k in JOB_KINDS], value="batch", allow_blank=False, id="f-kind"
                    )
            yield Static("", id="preview")
            with Horizontal(classes="buttons"):
                yield Button("Submit (ctrl+s)", variant="primary", id="yes")
                yield Button("Cancel (esc)", id="no")

    def on_mount(self) -> None:
        self.query_one("#f-command", Input).focus()
        self._update_preview()
        self._fit_height()

    def on_resize(self) -> None:
        self._fit_height()

    def _fit_height(self) -> None:
        """On a short terminal the fields scroll, so the preview and the buttons stay in view."""
        room = int(self.size.height * 0.9) - SUBMIT_CHROME_ROWS
        self.query_one("#submit-fields").styles.max_height = max(3, min(24, room))

    def form_values(self) -> dict[str, str]:
        return {key: self.query_one(f"#f-{key}", Input).value for key, _, _ in FIELDS}

    def _kind(self) -> str:
        value = self.query_one("#f-kind", Select).value
        return value if isinstance(value, str) else "batch"

    def _update_preview(self) -> None:
        preview = self.query_one("#preview", Static)
        try:
            spec = spec_from_form(self.form_values(), self._kind(), self._now())
        except ValueError as exc:
            self.spec = None
            preview.update(Text(str(exc), style="bold"))
            preview.set_class(True, "invalid")
            return
        preview.set_class(False, "invalid")
        self.spec = spec
        fits, answer = offers(spec, self._snapshot())
        if not fits:
            if answer.never_fits:
                line = answer.line[:1].upper() + answer.line[1:]
                preview.update(f"{line}: it would wait for a host that can run it.")
            else:
                line = answer.line.removeprefix("waiting: ")
                preview.update(f"Would wait: no host fits it now ({line}).")
            return
        lines = [f"Would go to {fits[0].hostname} — {len(fits)} host(s) fit now, best first:"]
        for fit in fits[:4]:
            gpus = ",".join(k.rsplit(":", 1)[-1] for k in fit.devices) or "cpu"
            lines.append(
                f"  {clip(fit.hostname, 20):<20} GPUs {clip(gpus, 15):<15} "
                f"util {fit.mean_util_pct:3.0f}%  queue {fit.queue}"
            )
        preview.update("\n".join(lines))

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._update_preview()

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self._update_preview()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.focus_next()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "yes":
            self.action_submit()
        else:
            self.dismiss(None)

    def action_submit(self) -> None:
        self._update_preview()
        if self.spec is not None:
            self.dismiss(self.spec)
        else:
            self.notify("fix the form first", severity="warning", timeout=3)

    def action_cancel(self) -> None:
        self.dismiss(None)
