"""Adding hosts from the TUI (``a``, ``:add``, the palette): who may, the form, the run.

The runs here go through the real ``shoal bootstrap`` code over real loopback sockets: a port
that refuses the connection, and a listener that never answers SSH (to close the screen while a
host is still connecting). A run over a real sshd into a real mesh is in
``tests/bootstrap/test_tui_addhost.py``.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input

from agent.bootstrap.hosts import parse_target
from agent.bootstrap.wheelhouse import local_version
from agent.common.errors import UserError
from gossip.identity import enroll_node, init_cluster
from tests.tui.helpers import command, sim_app, started, wait_for, wait_until
from tui.app import ShoalApp
from tui.cli import load_config
from tui.screens.addhost import AddHostScreen
from tui.screens.help import HelpScreen
from tui.screens.main import MainScreen


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """A cluster directory as ``shoal init`` makes it: the CA and the operator identity."""
    directory = tmp_path / "cluster"
    init_cluster(directory, "lab", "operator", datetime.now(UTC))
    return directory


def add_app(cluster: Path, tmp_path: Path, **kwargs: object) -> ShoalApp:
    """A TUI that may add hosts: the cluster's CA, and a known_hosts of its own."""
    known = tmp_path / "known_hosts"
    known.touch()
    app, _ = sim_app(identity_dir=cluster, bootstrap_args=("--known-hosts", str(known)), **kwargs)
    return app


def shown_actions(app: ShoalApp) -> set[str]:
    return {b.binding.action for b in app.screen.active_bindings.values() if b.enabled}


def notes(app: ShoalApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def open_form(pilot: Pilot[None], app: ShoalApp) -> AddHostScreen:
    await pilot.press("a")
    await wait_until(pilot, lambda: isinstance(app.screen, AddHostScreen))
    screen = app.screen
    assert isinstance(screen, AddHostScreen)
    return screen


def fill(form: AddHostScreen, **values: str) -> None:
    for key, value in values.items():
        form.query_one(f"#a-{key}", Input).value = value


def cell(form: AddHostScreen, host: str, column: str) -> str:
    return str(form.query_one("#addhost-progress", DataTable).get_cell(host, column))


async def refuses_add_host(pilot: Pilot[None], app: ShoalApp) -> None:
    """No ``a`` on the views that have it, and ``:add`` opens nothing."""
    for view in ("topology", "hosts"):
        await command(pilot, view)
        assert "add_host" not in shown_actions(app)
        await pilot.press("a")
        assert isinstance(app.screen, MainScreen)
    await command(pilot, "add alice@gpu1")
    await pilot.pause()
    assert isinstance(app.screen, MainScreen)


async def test_without_the_cluster_ca_the_key_is_hidden_and_asking_says_why(
    tmp_path: Path,
) -> None:
    # A second operator: its own identity, signed by the CA, but no CA key to sign with.
    keeper = init_cluster(tmp_path / "cluster", "lab", "alice", datetime.now(UTC))
    operator_only = tmp_path / "bob"
    enroll_node(keeper.ca, operator_only, "operator", ["bob"], timedelta(days=1), datetime.now(UTC))
    app, _ = sim_app(identity_dir=operator_only)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await refuses_add_host(pilot, app)
        [why] = [n for n in notes(app) if "cluster CA" in n]
        assert str(operator_only) in why and "\n" not in why
        # The palette offers it and answers the same one line.
        await pilot.press("ctrl+p")
        await pilot.press(*"add over")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: len([n for n in notes(app) if "cluster CA" in n]) == 2)
        assert isinstance(app.screen, MainScreen)
        # Help lists only the keys this TUI can use.
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "host.add" in app.screen.hidden


async def test_readonly_hides_add_host_everywhere(cluster: Path, tmp_path: Path) -> None:
    app = add_app(cluster, tmp_path, readonly=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await refuses_add_host(pilot, app)
        assert any(n.startswith("read-only") for n in notes(app))
        assert not app.outcomes


async def test_a_opens_the_form_on_hosts_and_topology_only(cluster: Path, tmp_path: Path) -> None:
    app = add_app(cluster, tmp_path)
    source = app.source
    source.identity = replace(source.identity, address="10.0.0.5:7946")  # as if an agent's
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        for view in ("gpus", "jobs", "events"):
            await command(pilot, view)
            assert "add_host" not in shown_actions(app)
        for view in ("topology", "hosts"):
            await command(pilot, view)
            assert "add_host" in shown_actions(app)
        form = await open_form(pilot, app)
        values = form.form_values()
        assert values["join"] == "10.0.0.5:7946"  # the agent this TUI is connected to
        assert values["targets"] == ""
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)
        # :add fills the targets in.
        await command(pilot, "add alice@gpu1 bob@gpu2:2222")
        await wait_until(pilot, lambda: isinstance(app.screen, AddHostScreen))
        form = app.screen
        assert isinstance(form, AddHostScreen)
        assert form.form_values()["targets"] == "alice@gpu1 bob@gpu2:2222"
        await pilot.press("escape")
        assert not app.outcomes
        # Help lists the key, with its id to rebind it.
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert app.screen.hidden == frozenset()
        assert app.key_display()["host.add"] == "a"


def _parser_error(target: str) -> str:
    with pytest.raises(UserError) as raised:
        parse_target(target)
    return str(raised.value)


async def test_bad_input_is_one_line_in_the_form(cluster: Path, tmp_path: Path) -> None:
    not_a_folder = tmp_path / "wheels.txt"
    not_a_folder.write_text("")
    no_wheel = tmp_path / "wheels"
    no_wheel.mkdir()
    bad_hosts = tmp_path / "hosts.toml"
    bad_hosts.write_text('[[host]]\naddress = "x@y"\nlisten = 7\n')
    cases: list[tuple[dict[str, str], str]] = [
        ({"targets": ""}, "name at least one host: user@host[:port]"),
        ({"targets": "alice@"}, _parser_error("alice@")),
        ({"targets": "ok@gpu1, bob@gpu1:99999"}, _parser_error("bob@gpu1:99999")),
        ({"targets": "[::1:22"}, _parser_error("[::1:22")),
        ({"targets": "a@gpu1 a@gpu1"}, "host a@gpu1 is named twice"),
        ({"join": "nowhere"}, "join: not a host:port address: 'nowhere'"),
        ({"join": " "}, "join: name an agent of this mesh (HOST:PORT) for the new hosts to join"),
        ({"ssh_key": str(tmp_path / "id_none")}, f"SSH key {tmp_path / 'id_none'}: no such file"),
        ({"hosts_file": str(bad_hosts)}, f"{bad_hosts}: host #1: listen must be a string"),
        # Checked by the command's own code on a worker thread, back in the form as one line.
        ({"wheelhouse": str(not_a_folder)}, f"--wheelhouse {not_a_folder}: not a folder"),
        (
            {"wheelhouse": str(no_wheel)},
            f"the wheelhouse {no_wheel} holds no shoal-{local_version()} wheel "
            "(build one with: shoal bootstrap --build-wheelhouse DIR)",
        ),
    ]
    app = add_app(cluster, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        form = await open_form(pilot, app)
        for values, expected in cases:
            fill(form, targets="alice@gpu1", join="127.0.0.1:7946", ssh_key="", wheelhouse="")
            fill(form, hosts_file="")
            fill(form, **values)
            await pilot.pause()
            assert form.error == ""
            await pilot.press("ctrl+s")
            await wait_until(pilot, lambda: form.phase == "form" and form.error != "")
            assert form.error == expected, values
            assert isinstance(app.screen, AddHostScreen)
        # Typing clears the error; nothing ran.
        form.query_one("#a-targets", Input).focus()
        await pilot.press("x")
        assert form.error == ""
        assert form.results is None and not app.outcomes and not app.ops_in_flight


async def test_a_host_that_refuses_ssh_fails_in_one_line(cluster: Path, tmp_path: Path) -> None:
    port = closed_port()
    target = f"alice@127.0.0.1:{port}"
    app = add_app(cluster, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        form = await open_form(pilot, app)
        fill(form, targets=target, join="127.0.0.1:7946")
        await pilot.press("enter")
        await wait_for(pilot, "the run to end", lambda: form.phase == "done")
        [result] = form.results or []
        assert not result.ok
        assert cell(form, target, "host") == target
        assert cell(form, target, "step") == "connecting"
        assert cell(form, target, "status") == "failed"
        line = f"host {target}: cannot connect over SSH: "
        assert form.summary[0] == "1 host(s): 0 ok, 1 failed"
        assert form.summary[1].startswith(line) and form.summary[1] == f"host {target}: " + (
            result.message
        )
        assert form.summary[1].endswith("connection refused: nothing listens there")
        outcome = app.outcomes[-1]
        assert (outcome.kind, outcome.ok, outcome.label) == ("bootstrap", False, f"add {target}")
        assert outcome.detail == form.summary[1]
        assert not app.ops_in_flight
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)


async def test_closing_the_form_while_a_host_connects_stops_the_run(
    cluster: Path, tmp_path: Path
) -> None:
    """A listener that takes the connection and never speaks SSH: the run waits there."""
    connected = asyncio.Event()
    closed = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.set()
        while await reader.read(4096):
            pass
        closed.set()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = f"alice@127.0.0.1:{port}"
    app = add_app(cluster, tmp_path)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            form = await open_form(pilot, app)
            fill(form, targets=target, join="127.0.0.1:7946")
            await pilot.press("ctrl+s")
            await wait_for(pilot, "the SSH connection", connected.is_set)
            await wait_until(pilot, lambda: form.steps.get(target, ("", ""))[1] == "running")
            assert cell(form, target, "step") == "connecting"
            assert app.ops_in_flight  # the header says a host is being added
            await pilot.press("escape")
            assert isinstance(app.screen, MainScreen)
            await wait_for(pilot, "the run to stop", lambda: bool(app.outcomes))
            outcome = app.outcomes[-1]
            assert outcome.kind == "bootstrap" and not outcome.ok
            assert outcome.detail.startswith("stopped")
            await wait_for(pilot, "the connection to close", closed.is_set)
            assert not app.ops_in_flight
            assert app.is_running
            # The TUI goes on: keys still work.
            await command(pilot, "jobs")
            assert app.main_screen().state.view == "jobs"
    finally:
        server.close()
        await server.wait_closed()


def test_bootstrap_args_in_tui_toml_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "tui.toml"
    path.write_text('[bootstrap]\nargs = ["--known-hosts", "/k", "--jobs", "4"]\n')
    assert load_config(path).bootstrap_args == ("--known-hosts", "/k", "--jobs", "4")
    for args, why in (
        ('["--uninstall"]', "--uninstall has no place"),
        ('["alice@gpu1"]', "name the hosts in the form"),
        ('["--jobs", "many"]', "argument --jobs: invalid int value: 'many'"),
        ('["--no-such-flag"]', "unrecognized arguments: --no-such-flag"),
        ("7", "args is a list of strings"),
    ):
        path.write_text(f"[bootstrap]\nargs = {args}\n")
        with pytest.raises(UserError, match="bootstrap") as raised:
            load_config(path)
        assert why in str(raised.value)
