"""The main screen: header, the five views, the command/filter bar and the footer.

Only the visible view is brought up to date on each snapshot; the others are marked dirty and
catch up when shown. Drilling (enter) pushes the current view on a stack; esc pops it, clears
a filter first, and never quits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, cast

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import ContentSwitcher, Input

from agent.job.jobspec import JobSpec
from agent.operator.client import ApiError, agent_address
from tui.context import ShoalContext
from tui.history import HistoryTarget
from tui.messages import (
    CancelJob,
    CordonHost,
    DrainHost,
    ForecastsWanted,
    MigrateJob,
    SubmitJob,
    UndrainHost,
    UsageWanted,
)
from tui.model import NO_FILTER, MeshSnapshot, RowFilter
from tui.preview import offers
from tui.screens.addhost import AddHostScreen, AddHostSettings
from tui.screens.confirm import ConfirmScreen
from tui.screens.describe import DescribeScreen, describe, json_body
from tui.screens.drain import DrainScreen
from tui.screens.fleet import FleetScreen
from tui.screens.help import HelpScreen
from tui.screens.history import HistoryScreen
from tui.screens.logs import LogsScreen
from tui.screens.migrate import ANY_HOST, MigrateScreen
from tui.screens.submit import FormSubmission, SubmitScreen
from tui.widgets.base import NO_SCOPE, VIEW_NAMES, Drill, Scope, Selection, SortKey, ViewContext
from tui.widgets.dataviews import DatasetsTable, UsageTable, usage_report
from tui.widgets.footer import KeyFooter
from tui.widgets.header import MeshHeader
from tui.widgets.tables import MeshTable
from tui.widgets.topology import TopologyView
from tui.widgets.views import EventsTable, GpusTable, HostsTable, JobsTable

HOST_ACTIONS = frozenset({"cordon", "drain", "undrain"})
JOB_ACTIONS = frozenset({"migrate", "cancel", "logs"})
MUTATING_ACTIONS = frozenset(
    {"cordon", "drain", "undrain", "submit", "migrate", "cancel", "add_host"}
)
"""Actions hidden and refused in ``--readonly``."""
ADD_HOST_VIEWS = frozenset({"topology", "hosts"})

View = TopologyView | MeshTable


@dataclass(frozen=True, slots=True)
class ViewState:
    view: str
    scope: Scope = NO_SCOPE
    row_filter: RowFilter = NO_FILTER
    cursor: str | None = None


class MainScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("colon", "command", "Cmd", id="shoal.command"),
        Binding("slash", "filter", "Filter", id="shoal.filter"),
        Binding("escape", "back", "Back", show=False, id="shoal.back"),
        Binding("question_mark", "help", "Help", id="shoal.help"),
        Binding("tab", "next_view", "View", show=False, id="shoal.next_view"),
        Binding("N", "sort('name')", "Name", show=False, id="sort.name"),
        Binding("U", "sort('util')", "Util", show=False, id="sort.util"),
        Binding("M", "sort('mem')", "Mem", show=False, id="sort.mem"),
        Binding("T", "sort('temp')", "Temp", show=False, id="sort.temp"),
        Binding("d", "describe", "Describe", id="row.describe"),
        Binding("y", "json", "JSON", show=False, id="row.json"),
        Binding("c", "cordon", "Cordon", id="host.cordon"),
        Binding("r", "drain", "Drain", id="host.drain"),
        Binding("u", "undrain", "Undrain", id="host.undrain"),
        Binding("n", "submit", "Submit", id="job.submit"),
        Binding("m", "migrate", "Migrate", id="job.migrate"),
        Binding("l", "logs", "Logs", id="job.logs"),
        Binding("ctrl+d", "cancel", "Cancel", id="job.cancel"),
        Binding("a", "add_host", "Add host", id="host.add"),
        Binding("D", "show('datasets')", "Data", id="view.datasets"),
        Binding("H", "show('usage')", "Usage", id="view.usage"),
        Binding("h", "history", "History", id="row.history"),
        Binding("F", "fleet", "Fleet", id="view.fleet"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.state = ViewState("topology")
        self.stack: list[ViewState] = []
        self.bar_mode: str | None = None
        self._filter_before = ""
        self._dirty: set[str] = set(VIEW_NAMES)
        self._filter_timer: Timer | None = None

    @property
    def shoal(self) -> ShoalContext:
        return cast(ShoalContext, self.app)

    def compose(self) -> ComposeResult:
        yield MeshHeader(self.shoal.source.identity, id="header")
        with ContentSwitcher(initial="topology", id="views"):
            yield TopologyView(id="topology")
            yield HostsTable(id="hosts")
            yield GpusTable(id="gpus")
            yield JobsTable(id="jobs")
            yield EventsTable(id="events")
            yield DatasetsTable(id="datasets")
            yield UsageTable(id="usage")
        yield Input(id="bar", placeholder="")
        yield KeyFooter()

    def on_mount(self) -> None:
        header = self.query_one(MeshHeader)
        header.readonly = self.shoal.readonly
        self.query_one("#bar", Input).display = False
        self.view_widget().focus()
        self.refresh_view()  # a snapshot that came before the screen had children

    # -- views -------------------------------------------------------------------------------

    def view_widget(self, name: str | None = None) -> View:
        return cast(View, self.query_one(f"#{name or self.state.view}"))

    def context(self) -> ViewContext:
        app = self.shoal
        return ViewContext(
            snapshot=app.snapshot,
            history=app.history,
            row_filter=self.state.row_filter,
            scope=self.state.scope,
            palette=app.palette,
            glyphs=app.glyphs,
        )

    def refresh_view(self) -> None:
        """A new snapshot: update the header and the visible view; the rest catch up later."""
        header = self._header()
        if header is None:
            return  # not composed yet, or being torn down at exit: the app keeps the snapshot
        header.palette = self.shoal.palette
        header.connection = self.shoal.connection
        header.error = self.shoal.connection_error or ""
        header.update_snapshot(self.shoal.snapshot)
        self._dirty.update(VIEW_NAMES)
        for name in VIEW_NAMES:
            if name != self.state.view:
                self.view_widget(name).release()  # rebuilt when shown; frees older snapshots
        self._apply_current()

    def show_busy(self, labels: tuple[str, ...]) -> None:
        """The operations running now, in the header."""
        header = self._header()
        if header is not None:
            header.busy = ("… " + "; ".join(labels)) if labels else ""

    def _header(self) -> MeshHeader | None:
        """The header, or None while the screen has no children (before compose, after exit)."""
        found = self.query(MeshHeader)
        return found.first() if found else None

    def _apply_current(self) -> None:
        self.view_widget().apply(self.context())
        self._dirty.discard(self.state.view)

    def show_view(self, name: str, scope: Scope = NO_SCOPE, *, push: bool = False) -> None:
        if name not in VIEW_NAMES:
            raise ValueError(name)
        current = self.view_widget()
        selection = current.selection()
        cursor_key = _selection_key(selection)
        if push:
            self.stack.append(replace(self.state, cursor=cursor_key))
        else:
            self.stack.clear()
        self.state = ViewState(name, scope)
        self._switch()

    def _switch(self) -> None:
        self.query_one("#views", ContentSwitcher).current = self.state.view
        widget = self.view_widget()
        self._apply_current()
        if self.state.cursor is not None:
            widget.select_key(self.state.cursor)
        widget.focus()
        header = self.query_one(MeshHeader)
        scope = f" > {self.state.scope.label}" if self.state.scope.active else ""
        header.view_label = self.state.view + scope
        header.filter_text = self.state.row_filter.text
        self.refresh_bindings()
        self.post_message(ForecastsWanted(self.state.view == "jobs"))
        if self.state.view == "usage":
            self.post_message(UsageWanted())

    def on_usage_wanted(self, message: UsageWanted) -> None:
        message.stop()
        self.load_usage()

    @work(exclusive=True, group="usage", name="usage")
    async def load_usage(self) -> None:
        """Every live agent's usage over the view's window, as ``shoal usage`` adds it up."""
        table = self.query_one("#usage", UsageTable)
        source = self.shoal.source
        now = source.now()
        since = now - table.window_s
        try:
            rows, missing = await source.usage(since)
        except ApiError as exc:
            self.notify(f"usage: {exc}", severity="error", timeout=6)
            return
        report = usage_report(rows, table.by, table.window, since, now, missing)
        table.show_report(report, self.context())
        if self.state.view == "usage":
            header = self.query_one(MeshHeader)
            header.view_label = f"usage > by {report.by}, last {report.window}"
        if missing:
            self.notify("usage without " + "; ".join(missing), severity="warning", timeout=6)

    def on_drill(self, message: Drill) -> None:
        message.stop()
        s = message.selection
        if s.kind == "host" and s.node_id is not None:
            label = self.shoal.snapshot.hostname(s.node_id)
            self.show_view("gpus", Scope(node_id=s.node_id, label=label), push=True)
        elif s.kind == "gpu" and s.node_id is not None:
            label = s.title or s.node_id[:8]
            scope = Scope(node_id=s.node_id, device_key=s.device_key, label=label)
            self.show_view("jobs", scope, push=True)
        elif s.kind == "job":
            self.action_describe()

    # -- the bar -----------------------------------------------------------------------------

    def _open_bar(self, mode: str, value: str, placeholder: str) -> None:
        bar = self.query_one("#bar", Input)
        self.bar_mode = mode
        bar.display = True
        bar.placeholder = placeholder
        bar.value = value
        bar.border_title = ":" if mode == "command" else "/"
        bar.set_class(mode == "filter", "filter")
        bar.focus()

    def _close_bar(self) -> None:
        bar = self.query_one("#bar", Input)
        bar.display = False
        self.bar_mode = None
        self.view_widget().focus()

    def action_command(self) -> None:
        self._open_bar(
            "command",
            "",
            ":hosts :gpus :jobs :events :data :usage :fleet :topology :logs JOB :add USER@HOST :q",
        )

    def action_filter(self) -> None:
        self._filter_before = self.state.row_filter.text
        self._open_bar("filter", self._filter_before, "regex; start with ! to invert")

    def set_filter(self, text: str) -> None:
        if text == self.state.row_filter.text:
            return
        self.state = replace(self.state, row_filter=RowFilter(text))
        self.query_one(MeshHeader).filter_text = text
        self._apply_current()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id != "bar" or self.bar_mode != "filter":
            return
        event.stop()
        if self._filter_timer is not None:
            self._filter_timer.stop()
        text = event.value
        self._filter_timer = self.set_timer(0.15, lambda: self.set_filter(text))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "bar":
            return
        event.stop()
        mode = self.bar_mode
        self._close_bar()
        if mode == "filter":
            if self._filter_timer is not None:
                self._filter_timer.stop()
            self.set_filter(event.value.strip())
        elif mode == "command":
            self.run_command(event.value)

    def run_command(self, text: str) -> None:
        """``hosts``, ``gpus``, ``jobs``, ``events``, ``datasets`` (``data``), ``usage``,
        ``fleet`` (the fleet's history), ``topology``,
        ``logs JOB``,
        ``add USER@HOST[:PORT] ...`` (the add-host form, filled in), ``q``."""
        words = text.strip().lstrip(":").split()
        if not words:
            return
        verb, args = words[0].lower(), words[1:]
        aliases = {
            "host": "hosts", "nodes": "hosts", "node": "hosts", "no": "hosts", "gpu": "gpus",
            "job": "jobs", "ev": "events", "event": "events", "topo": "topology", "top": "topology",
            "data": "datasets", "dataset": "datasets", "ds": "datasets", "use": "usage",
        }  # fmt: skip
        verb = aliases.get(verb, verb)
        if verb in VIEW_NAMES:
            self.show_view(verb)
        elif verb in ("q", "q!", "quit", "exit"):
            self.app.exit()
        elif verb == "logs":
            job_id = self._find_job(args[0]) if args else self._selected_job_id()
            if job_id is None:
                self.notify(f"no job {args[0] if args else 'selected'}", severity="warning")
            else:
                self._open_logs(job_id)
        elif verb == "help":
            self.action_help()
        elif verb == "fleet":
            self.action_fleet()
        elif verb == "add":
            self.request_add_host(" ".join(args))
        else:
            self.notify(f"unknown command :{verb}", severity="error", timeout=3)

    def _find_job(self, prefix: str) -> str | None:
        matches = [j.job_id for j in self.shoal.snapshot.jobs if j.job_id.startswith(prefix)]
        return matches[0] if len(matches) == 1 else None

    # -- global actions ----------------------------------------------------------------------

    def action_back(self) -> None:
        if self.bar_mode is not None:
            if self.bar_mode == "filter":
                self.set_filter(self._filter_before)
            self._close_bar()
        elif self.state.row_filter.active:
            self.set_filter("")
        elif self.stack:
            self.state = self.stack.pop()
            self._switch()

    def action_help(self) -> None:
        refused = self.shoal.operations.add_host_refusal()
        hidden = frozenset({"host.add"}) if refused else frozenset()
        self.app.push_screen(HelpScreen(self.shoal.key_display(), self.shoal.readonly, hidden))

    def action_show(self, name: str) -> None:
        """One view's own key (``D``: datasets, ``H``: usage)."""
        self.show_view(name)

    def action_next_view(self) -> None:
        names: tuple[str, ...] = VIEW_NAMES
        index = names.index(self.state.view) if self.state.view in names else 0
        self.show_view(names[(index + 1) % len(names)])

    def action_sort(self, key: str) -> None:
        if not self.view_widget().sort_by(cast(SortKey, key)):
            self.notify(f"this view does not sort by {key}", timeout=2)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in MUTATING_ACTIONS and self.shoal.readonly:
            return False
        view = self.state.view
        if action == "add_host":
            return view in ADD_HOST_VIEWS and self.shoal.operations.add_host_refusal() is None
        if action in HOST_ACTIONS:
            return view in ("topology", "hosts", "gpus")
        if action == "history":
            return view in ("topology", "hosts", "gpus", "jobs", "events")
        if action in JOB_ACTIONS:
            return view in ("jobs", "gpus", "topology", "events")
        return True

    # -- selection helpers -------------------------------------------------------------------

    def selection(self) -> Selection | None:
        return self.view_widget().selection()

    def _selected_host(self) -> str | None:
        s = self.selection()
        if s is None or s.node_id is None or s.kind not in ("host", "gpu"):
            self.notify("select a host first", severity="warning", timeout=2)
            return None
        return s.node_id

    def _selected_job_id(self) -> str | None:
        s = self.selection()
        if s is None or s.job_id is None:
            return None
        return s.job_id

    def _need_job(self) -> str | None:
        job_id = self._selected_job_id()
        if job_id is None:
            self.notify("select a job first", severity="warning", timeout=2)
        return job_id

    # -- row actions -------------------------------------------------------------------------

    def action_describe(self) -> None:
        s = self.selection()
        if s is None:
            return
        body = describe(s, self.shoal.snapshot)
        self.app.push_screen(DescribeScreen(f"{s.kind} {s.title}", body))

    def action_json(self) -> None:
        s = self.selection()
        if s is None:
            return
        self.app.push_screen(DescribeScreen(f"{s.kind} {s.title} (JSON)", json_body(s.raw)))

    def action_history(self) -> None:
        """The selected GPU's, host's or job's history, from its node's own store."""
        s = self.selection()
        target = None if s is None else history_target(s, self.shoal.snapshot)
        if target is None:
            self.notify("select a host, a GPU or a job that ran", severity="warning", timeout=3)
            return
        self.app.push_screen(
            HistoryScreen(self.shoal.source, target, ascii=self.shoal.glyphs.ascii)
        )

    def action_fleet(self) -> None:
        """The fleet's utilization and idle GPU-hours over time, from every node's history."""
        self.app.push_screen(FleetScreen(self.shoal.source, ascii=self.shoal.glyphs.ascii))

    def action_cordon(self) -> None:
        node = self._selected_host()
        if node is not None and not self.shoal.readonly:
            self.post_message(CordonHost(node))

    def action_undrain(self) -> None:
        node = self._selected_host()
        if node is not None and not self.shoal.readonly:
            self.post_message(UndrainHost(node))

    def action_drain(self) -> None:
        node = self._selected_host()
        host = self.shoal.snapshot.host(node)
        if host is None or self.shoal.readonly:
            return
        jobs = self.shoal.snapshot.jobs_on(host.node_id)

        def done(grace_s: float | None) -> None:
            if grace_s is not None:
                self.post_message(DrainHost(host.node_id, grace_s))

        self.app.push_screen(DrainScreen(host, jobs), done)

    def action_submit(self) -> None:
        if self.shoal.readonly:
            return

        def done(form: FormSubmission | None) -> None:
            if form is not None:
                self.post_message(SubmitJob(form.spec, form.workdir))

        app = self.shoal
        self.app.push_screen(SubmitScreen(lambda: app.snapshot, app.source.now), done)

    def action_migrate(self) -> None:
        job_id = self._need_job()
        if job_id is None or self.shoal.readonly:
            return
        job = self.shoal.snapshot.job(job_id)
        if job is None or job.state != "running" or job.runner is None:
            self.notify("only a running job can migrate", severity="warning", timeout=3)
            return
        try:
            spec = JobSpec.from_dict(job.spec)
        except ValueError as exc:
            self.notify(f"cannot read this job's spec: {exc}", severity="error")
            return
        fits, _ = offers(spec, self.shoal.snapshot, exclude=frozenset({job.runner}))
        current = self.shoal.snapshot.hostname(job.runner)

        def done(target: str | None) -> None:
            if target is not None:
                self.post_message(MigrateJob(job_id, None if target == ANY_HOST else target))

        self.app.push_screen(MigrateScreen(job, fits, current), done)

    def action_cancel(self) -> None:
        job_id = self._need_job()
        if job_id is None or self.shoal.readonly:
            return
        job = self.shoal.snapshot.job(job_id)
        if job is None or not job.live:
            self.notify("that job is not running or waiting", severity="warning", timeout=3)
            return

        def done(yes: bool | None) -> None:
            if yes:
                self.post_message(CancelJob(job_id))

        question = f"Cancel job {job_id[:8]} ({job.state}: {job.command[:40]})?"
        self.app.push_screen(ConfirmScreen(question, yes="Cancel job"), done)

    def action_add_host(self) -> None:
        self.request_add_host()

    def request_add_host(self, targets: str = "") -> None:
        """The add-host form (from ``a``, ``:add`` or the palette), or one line saying why not."""
        app = self.shoal
        why = app.operations.add_host_refusal()
        if why is not None or app.identity_dir is None:
            self.notify(why or "adding hosts is off", severity="warning", timeout=6)
            return
        join = app.source.identity.address
        try:
            agent_address(join)
        except ValueError:
            join = ""  # not an agent's address (a simulated mesh): the operator names one
        settings = AddHostSettings(app.identity_dir, join, app.bootstrap_args)
        self.app.push_screen(AddHostScreen(settings, targets))

    def action_logs(self) -> None:
        job_id = self._need_job()
        if job_id is not None:
            self._open_logs(job_id)

    def _open_logs(self, job_id: str) -> None:
        job = self.shoal.snapshot.job(job_id)
        title = job_id[:8] + (f" {job.command[:50]}" if job else "")
        self.app.push_screen(LogsScreen(self.shoal.source, job_id, title))


def main_screen(app: App[Any]) -> MainScreen:
    """The app's main screen, under any dialogs (LookupError before it is shown)."""
    for screen in app.screen_stack:
        if isinstance(screen, MainScreen):
            return screen
    raise LookupError("no main screen")


def history_target(s: Selection, snapshot: MeshSnapshot) -> HistoryTarget | None:
    """Whose history the selection asks for, and which node's agent keeps it."""
    node = s.node_id
    if s.kind == "job" and s.job_id is not None:
        job = snapshot.job(s.job_id)
        node = None if job is None else job.runner
    host = snapshot.host(node)
    if host is None:
        return None
    if s.kind == "gpu" and s.device_key is not None:
        return HistoryTarget("gpu", host.node_id, host.addr, s.title, device=s.device_key)
    if s.kind == "job" and s.job_id is not None:
        return HistoryTarget("job", host.node_id, host.addr, s.job_id[:8], job=s.job_id)
    if s.kind == "host":
        return HistoryTarget("host", host.node_id, host.addr, host.hostname)
    return None


def _selection_key(selection: Selection | None) -> str | None:
    if selection is None:
        return None
    if selection.kind == "gpu" and selection.node_id and selection.device_key:
        return f"{selection.node_id}/{selection.device_key}"
    if selection.kind == "job":
        return selection.job_id
    return selection.node_id
