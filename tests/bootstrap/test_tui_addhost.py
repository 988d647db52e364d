"""The TUI's add-host form against real OpenSSH servers on loopback, into a running local mesh.

The operator works only through the TUI's keys and form; the outcome is checked on the hosts
(known_hosts refusal, nothing created) and through the agents' own API.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input

from tests.bootstrap.conftest import Fleet
from tests.tui.helpers import command, wait_for
from tui.app import ShoalApp
from tui.cli import api_source
from tui.operations import STOPPED
from tui.screens.addhost import AddHostScreen
from tui.screens.main import MainScreen
from tui.widgets.tables import MeshTable

pytestmark = [pytest.mark.slow, pytest.mark.system]

EARLY_STEPS = ("waiting", "connecting", "probing")
"""Steps before bootstrap creates anything on the host."""


def processes_under(directory: Path) -> list[int]:
    """Pids of processes whose command line names ``directory`` (the host's agent, pip)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(str(directory) in part for part in proc.info["cmdline"] or ()):
            found.append(proc.info["pid"])
    return found


def addhost_app(fleet: Fleet) -> ShoalApp:
    """The TUI on the fleet's mesh, able to add hosts."""
    return ShoalApp(
        api_source(fleet.seed, fleet.cluster_dir),
        refresh_s=0.5,
        quiet_gc=False,
        identity_dir=fleet.cluster_dir,
        # As [bootstrap] args in tui.toml: this test's known_hosts, and the venv built from
        # this interpreter with its packages (the wheelhouse holds Shoal alone).
        bootstrap_args=(
            "--known-hosts",
            str(fleet.known_hosts),
            "--system-site-packages",
            "--python",
            sys.executable,
            "--join-timeout",
            "45",
        ),
    )


async def open_filled(
    pilot: Pilot[None], app: ShoalApp, fleet: Fleet, hosts_file: Path
) -> AddHostScreen:
    """``a``, then the form filled in for the hosts of ``hosts_file`` and sent."""
    await pilot.press("a")
    form = app.screen
    assert isinstance(form, AddHostScreen)
    form.query_one("#a-targets", Input).value = ""  # the form keeps what was typed before
    form.query_one("#a-hosts_file", Input).value = str(hosts_file)
    form.query_one("#a-ssh_key", Input).value = str(fleet.client_key)
    form.query_one("#a-wheelhouse", Input).value = str(fleet.wheelhouse)
    await pilot.press("ctrl+s")
    return form


async def test_the_tui_adds_a_host_over_ssh_and_shows_it_in_the_hosts_view(fleet: Fleet) -> None:
    [trusted] = fleet.add_hosts(1)
    [stranger] = fleet.add_hosts(1, trust=False)
    hosts_file = fleet.hosts_file([0])  # loopback listen port, simulated L4s, its own remote dir
    app = addhost_app(fleet)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, "the two agents", lambda: len(app.snapshot.hosts) == 2)
        await command(pilot, "hosts")
        hosts = app.main_screen().query_one("#hosts", MeshTable)

        # A host whose key is not in known_hosts: refused with its fingerprint and the command
        # that trusts it, the very line shoal bootstrap prints.
        await pilot.press("a")
        form = app.screen
        assert isinstance(form, AddHostScreen)
        assert form.form_values()["join"] == fleet.seed  # the agent this TUI talks to
        form.query_one("#a-targets", Input).value = stranger.address
        form.query_one("#a-ssh_key", Input).value = str(fleet.client_key)
        await pilot.press("ctrl+s")
        await wait_for(pilot, "the refusal", lambda: form.phase == "done")
        line = (
            f"host {stranger.address}: unknown host key ssh-ed25519 {stranger.fingerprint()}; "
            f"check it, then trust it with: ssh-keyscan -p {stranger.port} -t ed25519 127.0.0.1 "
            f">> {fleet.known_hosts} (or rerun with --accept-new)"
        )
        assert form.summary[1:] == [line]
        assert line in str(form.query_one("#addhost-summary").render())
        assert not fleet.remote_dir(1).exists()
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)

        # The trusted host, closed half-way: the run stops and the host is left as it was.
        form = await open_filled(pilot, app, fleet, hosts_file)
        remote = fleet.remote_dir(0)

        def under_way() -> bool:
            step, status = form.steps.get(trusted.address, ("", ""))
            return status == "running" and step not in EARLY_STEPS and remote.exists()

        await wait_for(pilot, "the setup to be under way", under_way, 30)
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)
        await wait_for(pilot, "the run to stop", lambda: app.outcomes[-1].detail == STOPPED, 30)
        assert not remote.exists()
        assert processes_under(remote) == []

        # Again, to the end: targets from a hosts file, the client key, the wheelhouse.
        form = await open_filled(pilot, app, fleet, hosts_file)
        await wait_for(pilot, "the host to be set up", lambda: form.phase == "done", 60)
        [result] = form.results or []
        assert result.ok, result.message
        assert (result.host, result.action) == (trusted.address, "installed")
        progress = form.query_one("#addhost-progress", DataTable)
        assert str(progress.get_cell(trusted.address, "status")) == "ok"
        assert form.summary[1].startswith(f"{trusted.address}: installed (")
        assert "2x NVIDIA L4 (simulated)" in form.summary[1]
        outcome = app.outcomes[-1]
        assert outcome.ok and outcome.label == f"add {trusted.address}"
        await pilot.press("escape")

        # The new node shows in the TUI's hosts view, alive, with its two GPUs.
        node_id = str(result.node_id)
        await wait_for(pilot, "the node in the hosts view", lambda: node_id in hosts.row_keys())
        host = app.snapshot.host(node_id)
        assert host is not None and host.state == "alive" and len(host.devices) == 2
        # And the mesh itself agrees, through an agent the TUI does not talk to.
        async with fleet.mesh.client(1) as client:
            node = next(n for n in await client.nodes() if n["node_id"] == node_id)
        assert node["state"] == "alive" and node["labels"] == {"rack": "r0"}


async def test_the_form_keeps_what_was_typed_and_trusts_new_host_keys_on_request(
    fleet: Fleet,
) -> None:
    [stranger] = fleet.add_hosts(1, trust=False)
    hosts_file = fleet.hosts_file([0])  # the stranger, with its own remote dir
    app = addhost_app(fleet)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, "the two agents", lambda: len(app.snapshot.hosts) == 2)
        # What was typed survives closing the form.
        await pilot.press("a")
        form = app.screen
        assert isinstance(form, AddHostScreen)
        form.query_one("#a-hosts_file", Input).value = str(hosts_file)
        form.query_one("#a-ssh_key", Input).value = str(fleet.client_key)
        form.query_one("#a-wheelhouse", Input).value = str(fleet.wheelhouse)
        await pilot.press("escape")
        await pilot.press("a")
        form = app.screen
        assert isinstance(form, AddHostScreen)
        assert form.form_values()["hosts_file"] == str(hosts_file)
        assert form.form_values()["ssh_key"] == str(fleet.client_key)

        # A key known_hosts does not know: refused, its fingerprint shown, trusted with t.
        await pilot.press("ctrl+s")
        await wait_for(pilot, "the refusal", lambda: form.phase == "done", 30)
        assert [r.new_host_key for r in form.untrusted] == [stranger.fingerprint()]
        summary = str(form.query_one("#addhost-summary").render())
        assert f"{stranger.address}  {stranger.fingerprint()}" in summary
        assert form.query_one("#trust").display
        await pilot.press("t")
        await wait_for(pilot, "the host to be set up", lambda: form.phase == "done", 90)
        [result] = form.results or []
        assert result.ok, result.message
        assert result.notes and stranger.fingerprint() in result.notes[0]
        assert stranger.known_hosts_line() in fleet.known_hosts.read_text()
        assert not form.query_one("#trust").display
        await pilot.press("escape")
        # Set up: the next form starts afresh.
        await pilot.press("a")
        form = app.screen
        assert isinstance(form, AddHostScreen)
        assert form.form_values()["hosts_file"] == ""
