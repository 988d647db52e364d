"""Command palette providers (ctrl+p): views, adding hosts, hosts and jobs by name, themes."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from tui.context import ShoalContext
from tui.screens.main import main_screen
from tui.widgets.base import VIEW_NAMES

MAX_HITS = 40


Command = tuple[str, Callable[[], object], str]


class ShoalCommands(Provider):
    """Go to a view, add hosts, jump to a host or job, switch theme."""

    @property
    def shoal(self) -> ShoalContext:
        return cast(ShoalContext, self.app)

    def _fixed(self) -> list[Command]:
        """The commands offered before anything is typed."""
        app = self.app
        main = main_screen(app)
        out: list[Command] = []
        for name in VIEW_NAMES:
            out.append((f"view: {name}", partial(main.show_view, name), f"show the {name} view"))
        fleet = "utilization by vendor and model, GPU-hours idle while jobs waited"
        out.append(("view: fleet history", main.action_fleet, fleet))
        if not self.shoal.readonly:
            help_text = "install, certify and start agents on new hosts (shoal bootstrap)"
            out.append(("host: add over SSH", main.request_add_host, help_text))
        out.append(("theme: colour-blind safe", partial(setattr, app, "theme", "shoal-colorblind"),
                    "Okabe-Ito colours for levels"))  # fmt: skip
        out.append(("theme: shoal", partial(setattr, app, "theme", "shoal"), "the default theme"))
        return out

    def _commands(self) -> list[Command]:
        snapshot = self.shoal.snapshot
        out = self._fixed()
        for host in snapshot.hosts:
            out.append(
                (f"host: {host.hostname}", partial(self._goto, "hosts", host.node_id), host.node_id)
            )
        for job in snapshot.jobs:
            out.append(
                (f"job: {job.job_id[:8]} {job.command[:40]}",
                 partial(self._goto, "jobs", job.job_id), job.state)
            )  # fmt: skip
        return out

    def _goto(self, view: str, key: str) -> None:
        main = main_screen(self.app)
        main.show_view(view)
        main.view_widget().select_key(key)

    async def discover(self) -> Hits:
        for name, callback, help_text in self._fixed():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        hits = 0
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
                hits += 1
                if hits >= MAX_HITS:
                    return
