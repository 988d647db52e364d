"""Shoal's operator TUI: one Textual app over a :class:`tui.source.MeshSource`.

One worker owns the mesh connection: it reads nodes, jobs and new events, builds a
:class:`tui.model.MeshSnapshot` and posts a coalescing :class:`tui.messages.MeshChanged`. Operator
actions come up from the screens as :class:`tui.messages.OperatorAction` messages and run as
exclusive workers (one group per kind of action); they show progress in the header while they run
(:mod:`tui.operations`) and report their outcome as a notification; then the mesh is read again at
once.

Imports point one way: the app assembles the screens and the palette providers, which read it
through :class:`tui.context.ShoalContext` and never import this module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual import events, on, work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.theme import Theme
from textual.worker import Worker

from agent.operator.client import ApiError
from tui.collector import QuietCollector
from tui.commands import ShoalCommands
from tui.context import ShoalContext
from tui.decode import SnapshotBuilder
from tui.messages import (
    ForecastsWanted,
    MeshChanged,
    OperationDone,
    OperationsChanged,
    OperatorAction,
)
from tui.model import EMPTY_SNAPSHOT, History, MeshSnapshot
from tui.operations import Operations, summary
from tui.screens.main import MainScreen, main_screen
from tui.source import MeshSource
from tui.widgets.render import DEFAULT_PALETTE, Glyphs, Palette

MAX_EVENTS = 5000
_INPUT_EVENTS = (events.Key, events.MouseDown, events.MouseScrollDown, events.MouseScrollUp)
THREAD_PARSE_HOSTS = 200
"""Above this many hosts the JSON is turned into a snapshot on a thread, off the event loop."""

SHOAL_THEME = Theme(
    name="shoal",
    primary="#4EA1FF",
    secondary="#7C8CFF",
    accent="#5FD7D7",
    warning="#E5C07B",
    error="#F0616D",
    success="#7FD17F",
    foreground="#D8DEE9",
    background="#11151C",
    surface="#181D26",
    panel="#222936",
    dark=True,
)
COLORBLIND_THEME = Theme(
    name="shoal-colorblind",
    primary="#56B4E9",
    secondary="#CC79A7",
    accent="#F0E442",
    warning="#E69F00",
    error="#D55E00",
    success="#0072B2",
    foreground="#EEEEEE",
    background="#101010",
    surface="#1A1A1A",
    panel="#2A2A2A",
    dark=True,
)
"""Okabe-Ito colours: blue, orange and vermillion stay apart for every common colour vision."""


class ShoalApp(App[None]):
    """The operator's view of one mesh.

    ``quiet_gc``: run full garbage collections only at quiet moments (:mod:`tui.collector`);
    on by default, off in tests that start many apps in one process. ``identity_dir``: the
    cluster directory of ``shoal init`` (the CA and the operator identity); adding hosts needs
    it, since each new node's certificate is signed with that CA. ``bootstrap_args``: extra
    ``shoal bootstrap`` flags for every host added from the TUI (``[bootstrap] args`` in
    ``tui.toml``).
    """

    TITLE = "shoal"
    CSS_PATH = "app.tcss"
    COMMANDS = App.COMMANDS | {ShoalCommands}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True, id="shoal.quit"),
        Binding("ctrl+p", "command_palette", "Palette", show=False, id="shoal.palette"),
    ]

    def __init__(
        self,
        source: MeshSource,
        *,
        readonly: bool = False,
        refresh_s: float = 2.0,
        ascii: bool = False,
        theme: str = "shoal",
        keymap: Mapping[str, str] | None = None,
        watch: bool = True,
        quiet_gc: bool = True,
        identity_dir: Path | None = None,
        bootstrap_args: Sequence[str] = (),
    ) -> None:
        super().__init__()
        self.source = source
        self.readonly = readonly
        self.identity_dir = identity_dir
        self.bootstrap_args: tuple[str, ...] = tuple(bootstrap_args)
        self.refresh_s = refresh_s
        self.glyphs = Glyphs(ascii=ascii)
        self.snapshot: MeshSnapshot = EMPTY_SNAPSHOT
        self.snapshot_serial = 0
        """How many snapshots have been shown (tests wait on it)."""
        self.history = History()
        self.builder = SnapshotBuilder()
        """Turns the mesh worker's reads into snapshots (static GPU fields parsed once)."""
        self.collector = QuietCollector()
        self._quiet_gc = quiet_gc
        self._backfilled = False
        self.forecasts_wanted = False
        """A view that shows the policy's forecasts is on screen (:class:`ForecastsWanted`)."""
        self.connection = "connecting"
        self.connection_error: str | None = None
        self.palette = DEFAULT_PALETTE
        self.operations = Operations(self, readonly=readonly, identity_dir=identity_dir)
        self._poke = asyncio.Event()
        self._watch = watch
        self._initial_theme = theme
        self.register_theme(SHOAL_THEME)
        self.register_theme(COLORBLIND_THEME)
        self.keymap_overrides: dict[str, str] = dict(keymap or {})
        if self.keymap_overrides:
            self.set_keymap(self.keymap_overrides)

    # -- lifecycle ---------------------------------------------------------------------------

    def on_mount(self) -> None:
        self.theme = (
            self._initial_theme if self._initial_theme in self.available_themes else "shoal"
        )
        self.theme_changed_signal.subscribe(self, self._on_theme_changed)
        self.palette = Palette.from_variables(self.get_css_variables())
        self.push_screen(MainScreen())
        if self._quiet_gc:
            self.collector.start()
        if self._watch:
            self.watch_mesh()

    async def on_unmount(self) -> None:
        self.collector.stop()
        await self.source.close()

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, _INPUT_EVENTS):
            self.collector.input_seen()
        await super().on_event(event)

    def _on_theme_changed(self, theme: Theme) -> None:
        self.palette = Palette.from_variables(self.get_css_variables())
        self.main_screen().refresh_view()

    def main_screen(self) -> MainScreen:
        return main_screen(self)

    # -- the mesh ----------------------------------------------------------------------------

    def poke(self) -> None:
        """Read the mesh again now instead of at the next tick."""
        self._poke.set()

    async def read_mesh(self, since: int, events: list[dict[str, Any]]) -> tuple[MeshSnapshot, int]:
        nodes = await self.source.nodes()
        jobs = await self.source.jobs()
        answer = await self.source.events(since)
        events.extend(answer.get("events") or ())
        del events[:-MAX_EVENTS]
        next_seq = int(answer.get("next") or since)
        now = self.source.now()
        if not self._backfilled:
            bucket = int(now // self.history.step_s)
            for key, values in self.source.backfill().items():
                self.history.seed(key, values, bucket)
            self._backfilled = True
        if len(nodes) > THREAD_PARSE_HOSTS:
            snapshot = await asyncio.to_thread(self.ingest, now, nodes, jobs, list(events))
        else:
            snapshot = self.ingest(now, nodes, jobs, events)
        return snapshot, next_seq

    def ingest(
        self,
        now: float,
        nodes: list[dict[str, Any]],
        jobs: list[dict[str, Any]],
        events: list[dict[str, Any]],
    ) -> MeshSnapshot:
        """The agents' JSON made a snapshot, its utilization added to the history.

        Runs on a worker thread for a big mesh; only the mesh worker calls it. A big mesh's
        policy forecasts (the jobs view's start and end) are made here too, off the event loop,
        while a view shows them (:attr:`forecasts_wanted`); a small mesh's when a view asks.
        """
        snapshot = self.builder.build(now, nodes, jobs, events)
        self.history.record(snapshot)
        if len(nodes) > THREAD_PARSE_HOSTS:
            if self.forecasts_wanted:
                snapshot.outlook()
            else:
                snapshot.defer_outlook()
        return snapshot

    @work(exclusive=True, group="mesh", name="mesh")
    async def watch_mesh(self) -> None:
        """The one worker that talks to the mesh for the views."""
        since = 0
        events: list[dict[str, Any]] = []
        while True:
            self._poke.clear()
            self.collector.maybe_collect()
            try:
                snapshot, since = await self.read_mesh(since, events)
                self.post_message(MeshChanged(snapshot, "connected"))
            except ApiError as exc:
                self.post_message(MeshChanged(self.snapshot, "unreachable", str(exc)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), self.refresh_s)

    def show_snapshot(self, snapshot: MeshSnapshot, connection: str = "connected") -> None:
        """Show ``snapshot`` now (the benchmark and tests call this directly)."""
        self.snapshot = snapshot
        self.connection = connection
        self.snapshot_serial += 1
        self.main_screen().refresh_view()

    def on_forecasts_wanted(self, message: ForecastsWanted) -> None:
        """A view that shows forecasts came on screen: read the mesh again now, with them."""
        turned_on = message.wanted and not self.forecasts_wanted
        self.forecasts_wanted = message.wanted
        if turned_on:
            self.poke()

    def on_mesh_changed(self, message: MeshChanged) -> None:
        self.connection_error = message.error
        self.show_snapshot(message.snapshot, message.connection)

    # -- operations --------------------------------------------------------------------------

    @property
    def ops_in_flight(self) -> dict[str, str]:
        """Token -> label of each operation running now."""
        return self.operations.in_flight

    @property
    def outcomes(self) -> list[OperationDone]:
        """Every finished operation, oldest first."""
        return self.operations.outcomes

    @on(OperatorAction)
    def _start_operation(self, action: OperatorAction) -> Worker[None]:
        """Run the operator's action as a worker, one group per kind of action."""
        group = f"op-{action.kind}"
        work = partial(self._operate, action)
        return self.run_worker(work, name=group, group=group, exclusive=True)

    async def _operate(self, action: OperatorAction) -> None:
        label = action.label(self.snapshot)
        with self.operations.running(f"{action.kind}:{label}", label):
            try:
                answer = await action.send(self.source)
                outcome = OperationDone(action.kind, label, True, summary(answer, self.snapshot))
            except ApiError as exc:
                outcome = OperationDone(action.kind, label, False, str(exc))
        self.operations.finish(outcome)

    def on_operations_changed(self, message: OperationsChanged) -> None:
        with contextlib.suppress(LookupError):
            self.main_screen().show_busy(message.labels)

    def on_operation_done(self, message: OperationDone) -> None:
        """Announce an operation's outcome, and read the mesh again at once."""
        if message.ok:
            self.notify(f"{message.label}: {message.detail}", title="done", timeout=4)
        else:
            self.notify(
                f"{message.label}: {message.detail}", title="failed", severity="error", timeout=8
            )
        self.poke()

    # -- keys --------------------------------------------------------------------------------

    def key_display(self) -> dict[str, str]:
        """Binding id -> the key it is on now (after the keymap), for the help screen."""
        from tui.widgets.dataviews import UsageTable
        from tui.widgets.tables import MeshTable
        from tui.widgets.topology import TopologyView

        out: dict[str, str] = {}
        for cls in (ShoalApp, MainScreen, MeshTable, TopologyView, UsageTable):
            for spec in cls.BINDINGS:
                if isinstance(spec, Binding) and spec.id:
                    keys = self.keymap_overrides.get(spec.id, spec.key)
                    first = keys.split(",")[0].strip()
                    out.setdefault(spec.id, self.get_key_display(Binding(first, spec.action)))
        return out


if TYPE_CHECKING:
    _READ_BY_SCREENS: type[ShoalContext] = ShoalApp  # mypy holds the app to what screens read
