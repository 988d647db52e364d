"""Migrate a job: pick one of the hosts it could start on now, best first as the policy ranks
them."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList, Static
from textual.widgets.option_list import Option

from tui.model import JobView
from tui.preview import Offer
from tui.widgets.render import clip

ANY_HOST = "*"


class MigrateScreen(ModalScreen[str | None]):
    """Answers the target node id, :data:`ANY_HOST` for "the best one", or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="dialog.cancel"),
    ]

    def __init__(self, job: JobView, fits: list[Offer], current: str) -> None:
        super().__init__()
        self.job = job
        self.fits = fits
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="migrate"):
            yield Label(f"Migrate job {self.job.job_id[:8]} from {self.current}", classes="title")
            if not self.fits:
                yield Static("No other host fits this job now.", classes="error")
            else:
                yield Static(
                    f"{len(self.fits)} host(s) fit; best first. Enter picks, esc cancels.",
                    classes="explain",
                )
                options = [Option("best host (let the mesh choose)", id=ANY_HOST)]
                for fit in self.fits[:200]:
                    gpus = ",".join(k.rsplit(":", 1)[-1] for k in fit.devices)
                    options.append(
                        Option(
                            f"{clip(fit.hostname, 20):<20} GPUs {clip(gpus, 16):<16} "
                            f"util {fit.mean_util_pct:3.0f}%  free {fit.free_gpus}",
                            id=fit.node_id,
                        )
                    )
                yield OptionList(*options, id="targets")

    def on_mount(self) -> None:
        if self.fits:
            self.query_one("#targets", OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
