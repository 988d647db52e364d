"""Submit a job through a form that previews where it would go before you confirm.

Every field of the job spec an operator sets is a one-line input, label and input on one line
in two columns (as k9s and lazygit lay out their forms), so the whole form, the policy's preview
and the buttons fit an 80x24 terminal without scrolling. The form only gathers text: the spec is
built by the same parser ``shoal submit`` uses (:meth:`agent.job.jobspec.JobSpec.from_human`), so a
value the agents would not honour is refused with that parser's one-line reason (GPUs is text,
so ``0.5`` can be typed and the parser says whether a share of a GPU is accepted).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Button, Input, Label, Select, Static

from agent.content.workdir import PENDING_DIGEST
from agent.job.jobspec import BACKENDS, CHECKPOINT_SIGNALS, INTERCONNECTS, JOB_KINDS, JobSpec
from tui.model import MeshSnapshot
from tui.preview import offers
from tui.widgets.render import clip


@dataclass(frozen=True, slots=True)
class Field:
    """One input of the form: its id (``f-<key>``), label, placeholder and first value."""

    key: str
    label: str
    placeholder: str = ""
    value: str = ""
    choices: tuple[str, ...] = ()
    """A fixed set (a select; the first is the default); empty for free text."""
    wide: bool = False
    """Takes the whole row."""


ANY: Final = "any"
FIELDS: Final[tuple[Field, ...]] = (
    Field("command", "Command", "python train.py --epochs 3", wide=True),
    Field("gpus", "GPUs/node", "none, 1, 2, 0.5", "1"),
    Field("kind", "Kind", choices=("batch", *(k for k in JOB_KINDS if k != "batch"))),
    Field("memory", "GPU mem", "any, e.g. 40GiB"),
    Field("backends", "Backends", f"any: {','.join(BACKENDS[:3])}"),
    Field("nodes", "Nodes", "1 (more: a gang)", "1"),
    Field("priority", "Priority", "0", "0"),
    Field("deadline", "Deadline", "none, e.g. 6h"),
    Field("max_runtime", "Max run", "none, e.g. 2h"),
    Field("datasets", "Datasets", "none, e.g. imagenet"),
    Field("retries", "Retries", "0", "0"),
    Field("interconnect", "Link", choices=(ANY, *INTERCONNECTS)),
    Field("signal", "Ckpt sig", choices=CHECKPOINT_SIGNALS),
    Field("affinity", "Affinity", "zone=eu-1"),
    Field("anti_affinity", "Avoid", "rack=r7"),
    Field("labels", "Labels", "team=ml on_late=refuse"),
    Field("preemptible", "Preempt", choices=("no", "yes")),
    Field("image", "Image", "none, reg:5000/app:1"),
    Field("workdir", "Workdir", "none, e.g. ~/proj"),
)
"""The form's inputs in tab order, laid out two to a row unless ``wide``."""


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.replace(" ", ",").split(",") if w.strip()]


def _number(text: str, label: str) -> int | float:
    """A number as typed: whole or not, the spec parser says whether it is accepted."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{label}: {text!r} is not a number") from None


def _pairs(text: str, label: str) -> dict[str, str]:
    """``zone=eu-1, rack=r7`` (commas or spaces between pairs) as a mapping."""
    out: dict[str, str] = {}
    for word in _words(text):
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise ValueError(f"{label}: {word!r} is not KEY=VALUE")
        out[key] = value
    return out


def spec_from_form(values: dict[str, str], now: float) -> JobSpec:
    """The job spec the form describes; ``ValueError`` (one line) when it is not valid.

    ``values`` holds each field's text (a select's choice) by key; an empty field is left out,
    so it takes the spec's default.
    """

    def text(key: str) -> str:
        return values.get(key, "").strip()

    try:
        command = shlex.split(values.get("command", ""))
    except ValueError as exc:
        raise ValueError(f"command: {exc}") from None
    if not command:
        raise ValueError("command: say what to run")
    resources: dict[str, Any] = {}
    if "-" in text("gpus"):  # a range (an elastic job): the spec parser reads it
        resources["gpus_per_node"] = text("gpus")
    elif text("gpus"):
        resources["gpus_per_node"] = _number(text("gpus"), "GPUs per node")
    if text("nodes"):
        resources["nodes"] = _number(text("nodes"), "nodes")
    if text("memory"):
        resources["min_mem_per_gpu_bytes"] = text("memory")
    if backends := _words(text("backends")):
        resources["backends"] = backends
    if text("interconnect") not in ("", ANY):
        resources["interconnect"] = text("interconnect")
    data: dict[str, Any] = {
        "command": command,
        "kind": text("kind") or "batch",
        "resources": resources,
        "preemptible": text("preemptible") == "yes",
        "datasets": _words(text("datasets")),
        "affinity": _pairs(text("affinity"), "affinity"),
        "anti_affinity": _pairs(text("anti_affinity"), "avoid"),
        "labels": _pairs(text("labels"), "labels"),
    }
    for key, wire, label in (
        ("priority", "priority", "priority"),
        ("retries", "retries", "retries"),
    ):
        if text(key):
            data[wire] = _number(text(key), label)
    if text("deadline"):
        data["deadline"] = text("deadline")
    if text("max_runtime"):
        data["max_runtime_s"] = text("max_runtime")
    if text("signal"):
        data["checkpoint_signal"] = text("signal")
    if text("image"):
        data["image"] = text("image")
    if workdir_of(values) is not None:
        data["workdir_digest"] = PENDING_DIGEST  # the folder's, once packed (on submission)
    return JobSpec.from_human(data, now=now)


def workdir_of(values: dict[str, str]) -> Path | None:
    """The form's working folder, to pack and send with the job (``ValueError``: not a
    folder)."""
    text = values.get("workdir", "").strip()
    if not text:
        return None
    folder = Path(text).expanduser()
    if not folder.is_dir():
        raise ValueError(f"workdir: {text} is not a folder")
    return folder


@dataclass(frozen=True, slots=True)
class FormSubmission:
    """What the form answers: the spec, and the folder to send with it (its ``workdir_digest``
    is a placeholder until the folder is packed)."""

    spec: JobSpec
    workdir: Path | None = None


PREVIEW_HOSTS: Final = 4
"""Hosts the preview lists under its first line."""


class SubmitScreen(ModalScreen[FormSubmission | None]):
    """Answers the spec to submit and its working folder, or None."""

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

    def _input(self, field: Field) -> Widget:
        if field.choices:
            return Select(
                [(c, c) for c in field.choices],
                value=field.choices[0],
                allow_blank=False,
                compact=True,
                id=f"f-{field.key}",
            )
        value = self._command if field.key == "command" else field.value
        return Input(value, placeholder=field.placeholder, compact=True, id=f"f-{field.key}")

    def _cell(self, field: Field) -> Horizontal:
        classes = "cell wide" if field.wide else "cell"
        return Horizontal(Label(field.label), self._input(field), classes=classes)

    def compose(self) -> ComposeResult:
        dialog = Vertical(classes="dialog", id="submit")
        dialog.border_title = "Submit a job"
        with dialog:
            with Vertical(id="submit-fields"):
                row: list[Widget] = []
                for field in FIELDS:
                    if field.wide:
                        yield Horizontal(self._cell(field), classes="row")
                        continue
                    row.append(self._cell(field))
                    if len(row) == 2:
                        yield Horizontal(*row, classes="row")
                        row = []
                if row:
                    yield Horizontal(*row, classes="row")
            yield Static("", id="preview")
            with Horizontal(classes="buttons"):
                yield Button("Submit ctrl+s", variant="primary", compact=True, id="yes")
                yield Button("Cancel esc", compact=True, id="no")

    def on_mount(self) -> None:
        self.query_one("#f-command", Input).focus()
        self._update_preview()

    def form_values(self) -> dict[str, str]:
        """Each field's text by key, as :func:`spec_from_form` reads it."""
        values: dict[str, str] = {}
        for field in FIELDS:
            widget = self.query_one(f"#f-{field.key}")
            if isinstance(widget, Select):
                values[field.key] = str(widget.value)
            elif isinstance(widget, Input):
                values[field.key] = widget.value
        return values

    def _update_preview(self) -> None:
        preview = self.query_one("#preview", Static)
        try:
            spec = spec_from_form(self.form_values(), self._now())
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
        for fit in fits[:PREVIEW_HOSTS]:
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
            self.dismiss(FormSubmission(self.spec, workdir_of(self.form_values())))
        else:
            self.notify("fix the form first", severity="warning", timeout=3)

    def action_cancel(self) -> None:
        self.dismiss(None)
