"""Add hosts over SSH from the TUI (``a``, ``:add``): the very run of ``shoal bootstrap``.

The form stands for a ``shoal bootstrap`` command line. Its fields become the words the
command's own parser reads (:func:`agent.cli.bootstrap_args.parse_bootstrap_args`): the targets,
``--hosts-file``, ``--ssh-key``, ``--wheelhouse``, ``--join``, the TUI's ``--identity`` and the
``[bootstrap] args`` of ``tui.toml``. The TUI's :class:`~tui.operations.Operations` checks them
and runs them with the command's own code, and posts each host's steps and the end of the run to
this screen, which renders them; the summary lines of failed hosts are the command's own.
Closing the screen while hosts are being set up stops the run: each host undoes what this run did
there, as after a failure, and the outcome is announced when that is finished.

Host keys: "Trust new host keys" is ``--accept-new``. A run that met hosts whose keys known_hosts
does not know shows their fingerprints and offers to trust them and run again (``t``). What was
typed is kept when the form is closed before the hosts were all set up, and is there again the
next time it opens.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, DataTable, Input, Label, Static

from agent.bootstrap.hostrun import HostResult
from agent.bootstrap.hosts import parse_target
from agent.bootstrap.ssh import BootstrapError
from agent.cli.bootstrap_args import parse_bootstrap_args
from agent.cli.bootstrap_cmd import collect_hosts
from agent.common.errors import UserError
from agent.operator.client import agent_address
from tui.context import ShoalContext
from tui.messages import HostsAdded, HostStep
from tui.operations import result_line
from tui.widgets.render import Palette

FIELDS: tuple[tuple[str, str, str], ...] = (
    ("targets", "Hosts", "user@host[:port] ... (spaces or commas between hosts)"),
    ("ssh_key", "SSH key", "optional: a private key file (else ssh-agent and ~/.ssh)"),
    ("wheelhouse", "Wheelhouse", "optional: a folder of wheels (else the package index)"),
    ("join", "Join", "HOST:PORT of an agent of this mesh (spaces or commas between)"),
    ("hosts_file", "Hosts file", "optional: a TOML file of [[host]] (listen, sim, labels...)"),
)
EXPLAIN = (
    "Runs shoal bootstrap on each host: checks its host key, installs Shoal, signs the node's "
    "certificate with your CA, starts the agent, waits for it in the mesh. A failure is undone."
)
FIELDS_ROWS = 3 * len(FIELDS) + 3
"""Rows the fields take, the trust box included."""
CHROME_ROWS = 10
"""Rows of the dialog around its body: border, padding, title, buttons."""
EXPLAIN_MIN_HEIGHT = 32
"""The explanation shows on screens at least this tall (on a short one, the fields come first)."""
REFUSED_EXTRA = ("--uninstall", "--build-wheelhouse", "--identity")
"""Flags of ``shoal bootstrap`` that have no place in ``[bootstrap] args``."""
ACCEPT_NEW = "accept_new"
ACCEPT_NEW_LABEL = "Trust new host keys (record the key of a host never seen; refuse a changed one)"
_DRAFTS: dict[Path, dict[str, str]] = {}
"""What was typed in a form closed before its hosts were all set up, by cluster folder."""


@dataclass(frozen=True, slots=True)
class AddHostSettings:
    """What the form starts from: the cluster directory, the join address, extra flags."""

    identity_dir: Path
    join: str = ""
    extra_args: tuple[str, ...] = ()


def split_words(text: str) -> list[str]:
    """``"a@b, c@d  e"`` -> ``["a@b", "c@d", "e"]``."""
    return [w for w in text.replace(",", " ").split() if w]


def check_extra_args(words: Sequence[str]) -> None:
    """``[bootstrap] args`` of tui.toml: ``shoal bootstrap`` flags that add hosts, or UserError."""
    args = parse_bootstrap_args(words)
    if args.hosts or args.hosts_file is not None:
        raise UserError("name the hosts in the form, not in [bootstrap] args")
    used = {
        "--uninstall": args.uninstall,
        "--build-wheelhouse": args.build_wheelhouse is not None,
        "--identity": args.identity is not None,
    }
    for flag in REFUSED_EXTRA:
        if used[flag]:
            raise UserError(f"{flag} has no place in [bootstrap] args (the TUI only adds hosts)")


def _path(text: str) -> Path:
    return Path(text.strip()).expanduser()


def form_words(values: Mapping[str, str], settings: AddHostSettings) -> list[str]:
    """The ``shoal bootstrap`` words the form stands for; UserError (one line) for a wrong field.

    Targets are checked with the command's own parser
    (:func:`agent.bootstrap.hosts.parse_target`); the rest is checked by the command's code when
    the words are parsed and planned.
    """
    targets = split_words(values.get("targets", ""))
    hosts_file = values.get("hosts_file", "").strip()
    if not targets and not hosts_file:
        raise UserError("name at least one host: user@host[:port]")
    for target in targets:
        parse_target(target)
    joins = split_words(values.get("join", ""))
    if not joins:
        raise UserError("join: name an agent of this mesh (HOST:PORT) for the new hosts to join")
    words = [*settings.extra_args, "--identity", str(settings.identity_dir)]
    if values.get(ACCEPT_NEW) == "yes":
        words.append("--accept-new")
    for join in joins:
        try:
            agent_address(join)
        except ValueError as exc:
            raise UserError(f"join: {exc}") from None
        words += ["--join", join]
    ssh_key = values.get("ssh_key", "").strip()
    if ssh_key:
        key = _path(ssh_key)
        if not key.is_file():
            raise UserError(f"SSH key {key}: no such file")
        words += ["--ssh-key", str(key)]
    wheelhouse = values.get("wheelhouse", "").strip()
    if wheelhouse:
        words += ["--wheelhouse", str(_path(wheelhouse))]
    if hosts_file:
        words += ["--hosts-file", str(_path(hosts_file))]
    return [*words, "--", *targets]


class AddHostScreen(ModalScreen[None]):
    """The form, then one row per host (its current step and status), then a summary."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close", id="dialog.cancel"),
        Binding("ctrl+s", "submit", "Add", id="addhost.confirm", priority=True),
        Binding("t", "trust", "Trust keys", id="addhost.trust", show=False),
    ]

    def __init__(self, settings: AddHostSettings, targets: str = "") -> None:
        super().__init__()
        self.settings = settings
        self.initial_targets = targets
        self.phase = "form"
        """``form``, ``checking`` (reading the CA and the wheelhouse), ``running`` or ``done``."""
        self.steps: dict[str, tuple[str, str]] = {}
        """Host -> (its current step, its status: waiting, running, undoing, ok or failed)."""
        self.results: list[HostResult] | None = None
        self.summary: list[str] = []
        self._run: asyncio.Task[list[HostResult] | None] | None = None
        self._stopping = False

    @property
    def shoal(self) -> ShoalContext:
        return cast(ShoalContext, self.app)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="addhost"):
            yield Label("Add hosts over SSH", classes="title")
            yield Static(EXPLAIN, classes="explain", id="addhost-explain")
            with VerticalScroll(id="addhost-fields"):
                draft = self._draft()
                for key, label, placeholder in FIELDS:
                    with Horizontal(classes="field"):
                        yield Label(f"{label:<15}")
                        yield Input(draft.get(key, ""), placeholder=placeholder, id=f"a-{key}")
                yield Checkbox(
                    ACCEPT_NEW_LABEL, draft.get(ACCEPT_NEW) == "yes", id=f"a-{ACCEPT_NEW}"
                )
            yield Static("", id="addhost-error", classes="error")
            with VerticalScroll(id="addhost-run"):
                yield DataTable(id="addhost-progress", cursor_type="none", show_cursor=False)
                yield Static("", id="addhost-summary")
            with Horizontal(classes="buttons"):
                yield Button("Add (ctrl+s)", variant="primary", id="yes")
                yield Button("Trust and run again (t)", variant="warning", id="trust")
                yield Button("Cancel (esc)", id="no")

    def on_mount(self) -> None:
        table = self.query_one("#addhost-progress", DataTable)
        table.add_column("host", key="host")
        table.add_column("step", key="step")
        table.add_column("status", key="status")
        self._set_phase("form")
        self.query_one("#a-targets", Input).focus()

    def on_resize(self) -> None:
        self._fit_height()

    def _fit_height(self) -> None:
        """On a short terminal the fields (or the progress) scroll; the buttons stay in view."""
        height = self.size.height
        explain = self.phase == "form" and height >= EXPLAIN_MIN_HEIGHT
        self.query_one("#addhost-explain").display = explain
        room = int(height * 0.9) - CHROME_ROWS - 1  # the error line
        if explain:
            room -= 3
        self.query_one("#addhost-fields").styles.max_height = max(3, min(FIELDS_ROWS, room))
        self.query_one("#addhost-run").styles.max_height = max(4, room)

    # -- the form ----------------------------------------------------------------------------

    def _draft(self) -> dict[str, str]:
        """What the form opens with: what was typed last time (kept when it was closed before
        its hosts were all set up), the targets it was opened for, the agent the TUI talks to."""
        draft = dict(_DRAFTS.get(self.settings.identity_dir, {}))
        if self.initial_targets:
            draft["targets"] = self.initial_targets
        if not draft.get("join"):
            draft["join"] = self.settings.join
        return draft

    def form_values(self) -> dict[str, str]:
        values = {key: self.query_one(f"#a-{key}", Input).value for key, _, _ in FIELDS}
        values[ACCEPT_NEW] = "yes" if self.query_one(f"#a-{ACCEPT_NEW}", Checkbox).value else ""
        return values

    @property
    def untrusted(self) -> list[HostResult]:
        """Hosts the last run stopped at for a key known_hosts does not know."""
        return [r for r in self.results or [] if r.new_host_key]

    @property
    def error(self) -> str:
        """The one-line error shown in the form ('' when none)."""
        return str(self.query_one("#addhost-error", Static).render())

    def _show_error(self, text: str) -> None:
        error = self.query_one("#addhost-error", Static)
        error.update(Text(text))
        error.display = bool(text)

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if self.phase == "form":
            self._show_error("")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "yes":
            self.action_submit()
        elif event.button.id == "trust":
            self.action_trust()
        else:
            self.action_close()

    def action_submit(self) -> None:
        if self.phase != "form":
            return
        try:
            args = parse_bootstrap_args(form_words(self.form_values(), self.settings))
            collect_hosts(args)  # the hosts file, and a host named twice
        except UserError as exc:
            self._show_error(str(exc))
            return
        self._set_phase("checking")
        self.run_bootstrap(args)

    def action_trust(self) -> None:
        """Trust the new host keys the last run met (their fingerprints are shown) and run the
        same form again with ``--accept-new``; the hosts already set up are left as they are."""
        if self.phase != "done" or not self.untrusted:
            return
        self.query_one(f"#a-{ACCEPT_NEW}", Checkbox).value = True
        self._set_phase("form")
        self.action_submit()

    def action_close(self) -> None:
        done = self.results is not None and all(r.ok for r in self.results)
        if done:
            _DRAFTS.pop(self.settings.identity_dir, None)
        else:
            _DRAFTS[self.settings.identity_dir] = self.form_values()
        self.stop()
        self.dismiss(None)

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        form = phase == "form"
        for key, _, _ in FIELDS:
            self.query_one(f"#a-{key}", Input).disabled = not form
        self.query_one(f"#a-{ACCEPT_NEW}", Checkbox).disabled = not form
        self.query_one("#addhost-fields").display = phase in ("form", "checking")
        self.query_one("#trust", Button).display = phase == "done" and bool(self.untrusted)
        self.query_one("#addhost-run").display = phase in ("running", "done")
        self.query_one("#addhost-summary").display = phase == "done"
        self._fit_height()
        yes = self.query_one("#yes", Button)
        yes.display = form
        no = self.query_one("#no", Button)
        no.label = {"form": "Cancel (esc)", "done": "Close (esc)"}.get(phase, "Stop (esc)")
        if not form:
            no.focus()

    # -- the run -----------------------------------------------------------------------------

    @work(exclusive=True, group="bootstrap")
    async def run_bootstrap(self, args: argparse.Namespace) -> None:
        """Have the TUI's operations check the words as the command does, then run every host
        with the command's code; this screen shows each host's steps and the end."""
        operations = self.shoal.operations
        try:
            plan = await operations.plan_hosts(args)
        except (UserError, BootstrapError, OSError) as exc:
            self._set_phase("form")
            self._show_error(str(exc))
            return
        self._start_rows(plan.hosts)
        run = operations.add_hosts(plan, self)
        self._run = run
        try:
            await asyncio.shield(run)
        except asyncio.CancelledError:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop what runs, once: the check of the form, or the hosts (each undoes its part)."""
        self.workers.cancel_group(self, "bootstrap")
        run = self._run
        if run is not None and not run.done() and not self._stopping:
            self._stopping = True
            run.cancel()

    def _start_rows(self, hosts: Sequence[str]) -> None:
        table = self.query_one("#addhost-progress", DataTable)
        table.clear()
        self.steps = {}
        for host in hosts:
            self.steps[host] = ("waiting", "waiting")
            table.add_row(Text(host), Text("waiting"), self._status("waiting"), key=host)
        self._set_phase("running")

    @on(HostStep)
    def _host_step(self, message: HostStep) -> None:
        message.stop()
        if message.host not in self.steps:
            return
        step, _status_now = self.steps[message.host]
        if message.text == "done":
            status = "ok"
        elif message.text == "failed":
            status = "failed"
        elif message.text.startswith("undoing"):
            status = "undoing"  # the step stays the one that failed
        else:
            step, status = message.text, "running"
        self.steps[message.host] = (step, status)
        table = self.query_one("#addhost-progress", DataTable)
        table.update_cell(message.host, "step", Text(step), update_width=True)
        table.update_cell(message.host, "status", self._status(status))

    @on(HostsAdded)
    def _hosts_added(self, message: HostsAdded) -> None:
        message.stop()
        self._finish(message.results, message.crash)

    def _finish(self, results: list[HostResult], crash: str | None = None) -> None:
        """Show the summary (the screen may already be closed: then there is nothing to show)."""
        self.results = results
        ok = sum(r.ok for r in results)
        head = f"{len(results)} host(s): {ok} ok, {len(results) - ok} failed"
        self.summary = [crash] if crash else [head, *(result_line(r) for r in results)]
        if not self.is_attached:
            return
        palette = self._palette()
        text = Text()
        if crash is not None:
            text.append(crash, style=palette.bad)
        else:
            text.append(head, style="bold")
            for result, line in zip(results, self.summary[1:], strict=True):
                text.append("\n")
                text.append(line, style=palette.ok if result.ok else palette.bad)
            untrusted = [r for r in results if r.new_host_key]
            if untrusted:
                text.append("\n\nNew host keys (compare with the hosts' own, then t to trust):")
                for r in untrusted:
                    text.append(f"\n  {r.host}  {r.new_host_key}", style=palette.warn)
        self.query_one("#addhost-summary", Static).update(text)
        self._set_phase("done")

    def _palette(self) -> Palette:
        return self.shoal.palette

    def _status(self, status: str) -> Text:
        palette = self._palette()
        style = {"ok": palette.ok, "failed": palette.bad, "running": palette.warn}
        style["undoing"] = palette.bad
        return Text(status, style=style.get(status, palette.muted))
