"""``shoal demo`` stopped as an operator or a service manager stops it: Ctrl-C (once or twice)
at the live table, SIGTERM or SIGHUP with stdout not a terminal. It says how to reach the mesh,
and stopping it leaves no agent and no folder (the CA key was in it); killed outright, it leaves
no agent."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from agent.cli.demo import _Signals, _Stop
from agent.execution.spawn import death_signal_launcher
from tests.shoal_cli import SHOAL, shoal
from tests.support import require_system

pytestmark = pytest.mark.slow

READY_S = 120.0


def _agents_of(root: Path) -> list[psutil.Process]:
    """The ``shoal agent`` processes whose command line names a folder under ``root``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if "agent" in cmdline and any(str(root) in word for word in cmdline):
            found.append(process)
    return found


def _assert_stopped_cleanly(demo: subprocess.Popen[str], root: Path) -> None:
    """The demo exits 0 without a traceback, its agents gone and its folder removed."""
    assert demo.wait(timeout=60) == 0
    assert demo.stderr is not None and "Traceback" not in demo.stderr.read()
    assert not root.exists()
    assert _agents_of(root) == []


def _kill_leftovers(demo: subprocess.Popen[str], root: Path | None) -> None:
    if demo.poll() is None:
        demo.kill()
    demo.communicate()  # reaps it and closes its pipes
    if root is not None:
        for process in _agents_of(root):
            os.killpg(process.pid, signal.SIGKILL)


def _first_lines(demo: subprocess.Popen[str], count: int) -> list[str]:
    assert demo.stdout is not None
    lines = []
    deadline = time.monotonic() + READY_S
    while len(lines) < count and time.monotonic() < deadline:
        line = demo.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
    return lines


@pytest.mark.parametrize(
    ("stop", "as_json"), [(signal.SIGTERM, False), (signal.SIGHUP, True)], ids=["term", "hup"]
)
def test_a_signal_stops_every_agent_and_removes_the_folder(
    stop: signal.Signals, as_json: bool
) -> None:
    demo = subprocess.Popen(
        [*SHOAL, "demo", "--nodes", "2", *(["--json"] if as_json else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    root: Path | None = None
    try:
        if as_json:
            reach = json.loads(_first_lines(demo, 1)[0])
            agent, identity = reach["agent"], reach["identity"]
        else:
            lines = _first_lines(demo, 4)
            exports = dict(
                line.removeprefix("export ").split("=", 1)
                for line in lines
                if line.startswith("export ")
            )
            agent, identity = exports["SHOAL_AGENT"], f"{exports['SHOAL_HOME']}/cluster"
            assert f"--identity {identity}" in lines[-1], lines
        root = Path(identity).parent
        assert (root / "cluster" / "ca.key").exists()
        assert len(_agents_of(root)) == 2

        nodes = shoal("nodes", "--json", "--agent", agent, "--identity", identity)
        assert nodes.returncode == 0, nodes.stderr
        assert [n["state"] for n in json.loads(nodes.stdout)] == ["alive", "alive"]

        demo.send_signal(stop)
        _assert_stopped_cleanly(demo, root)
    finally:
        _kill_leftovers(demo, root)


def _drain(fd: int) -> None:
    """Read what the demo draws, so it never blocks on a full terminal."""
    try:
        while os.read(fd, 65536):
            pass
    except OSError:  # the demo closed its end
        pass
    finally:
        os.close(fd)


def test_ctrl_c_twice_in_the_live_table_still_stops_every_agent() -> None:
    """An operator who presses Ctrl-C twice: the second one lands while the first is cleaning
    up, and must not leave the demo hung and its agents running (it did under asyncio's own
    Ctrl-C handling)."""
    screen, terminal = pty.openpty()  # the live table draws on a terminal
    demo = subprocess.Popen(
        [*SHOAL, "demo", "--plain", "--nodes", "2"],
        stdin=terminal,
        stdout=terminal,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(terminal)
    threading.Thread(target=_drain, args=(screen,), daemon=True).start()
    root: Path | None = None
    try:
        deadline = time.monotonic() + READY_S
        agents: list[psutil.Process] = []
        while len(agents) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            agents = [p for p in psutil.Process(demo.pid).children() if "agent" in p.cmdline()]
        assert len(agents) == 2, "the demo started no agents"
        data_dir = agents[0].cmdline()[agents[0].cmdline().index("--data-dir") + 1]
        root = Path(data_dir).parent
        identity = str(root / "cluster")
        address = agents[0].cmdline()[agents[0].cmdline().index("--listen") + 1]
        alive: list[str] = []
        while alive != ["alive", "alive"] and time.monotonic() < deadline:
            nodes = shoal("nodes", "--json", "--agent", address, "--identity", identity)
            alive = [n["state"] for n in json.loads(nodes.stdout)] if nodes.returncode == 0 else []
        assert alive == ["alive", "alive"]
        time.sleep(1.5)  # the live table is drawing

        demo.send_signal(signal.SIGINT)
        demo.send_signal(signal.SIGINT)
        _assert_stopped_cleanly(demo, root)
    finally:
        _kill_leftovers(demo, root)


def test_the_first_stop_signal_ends_the_demo_and_the_next_ones_wait_for_its_cleanup() -> None:
    """Inside the demo's loop, Ctrl-C ends it through the demo's handler, not asyncio's (whose
    second Ctrl-C raises wherever the loop is, mid-cleanup); later signals are ignored until the
    demo has stopped its agents."""

    async def live_table() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(5.0)

    before = signal.getsignal(signal.SIGINT)  # Python's default, unless a test before changed it
    with _Signals():
        with pytest.raises(_Stop):
            asyncio.run(live_table())
        for sig in (signal.SIGINT, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            os.kill(os.getpid(), sig)  # the cleanup goes on
        time.sleep(0.1)
    assert signal.getsignal(signal.SIGINT) is before  # not asyncio's, nor ignored


def test_a_demo_killed_outright_leaves_no_agent_running() -> None:
    """SIGKILL gives the demo no cleanup: its agents, armed to get SIGTERM when it dies, stop on
    their own (the folder stays, as after any crash)."""
    require_system(bool(death_signal_launcher("TERM")), "setpriv (util-linux) arms the signal")
    demo = subprocess.Popen(
        [*SHOAL, "demo", "--nodes", "2", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    root: Path | None = None
    try:
        reach = json.loads(_first_lines(demo, 1)[0])
        root = Path(reach["identity"]).parent
        assert len(_agents_of(root)) == 2

        demo.kill()
        demo.wait()
        deadline = time.monotonic() + 30
        while _agents_of(root) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _agents_of(root) == []
        logs = [(root / f"agent-{i:02d}" / "agent.log").read_text() for i in range(2)]
        assert all("agent_stopping" in log for log in logs)  # a clean stop, not a kill
    finally:
        _kill_leftovers(demo, root)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def _wait_for(path: Path, text: str, timeout_s: float) -> str:
    """``path``'s content once it holds ``text`` (or whatever it holds at the timeout)."""
    deadline = time.monotonic() + timeout_s
    content = path.read_text()
    while text not in content and time.monotonic() < deadline:
        time.sleep(0.1)
        content = path.read_text()
    return content


def test_the_plain_table_written_to_a_file_names_the_mesh_at_once(tmp_path: Path) -> None:
    """``shoal demo --plain > demo.log &``: the mesh's address is in the file within 5 s of its
    agents starting, and the tables follow, flushed, while the demo runs (it wrote nothing:
    a live table draws only on a terminal, and only its hint named the mesh)."""
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        demo = subprocess.Popen(
            [*SHOAL, "demo", "--plain", "--nodes", "2"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
        )
    root: Path | None = None
    try:
        deadline = time.monotonic() + READY_S
        agents: list[psutil.Process] = []
        while len(agents) < 2 and time.monotonic() < deadline and demo.poll() is None:
            time.sleep(0.1)
            agents = [p for p in psutil.Process(demo.pid).children() if "agent" in p.cmdline()]
        assert len(agents) == 2, "the demo started no agents"
        address = agents[0].cmdline()[agents[0].cmdline().index("--listen") + 1]
        root = Path(agents[0].cmdline()[agents[0].cmdline().index("--data-dir") + 1]).parent

        content = _wait_for(log, f"--identity {root / 'cluster'}\n", 5.0)  # the last line
        assert f"export SHOAL_AGENT={address}\n" in content, content
        assert f"export SHOAL_HOME={root}\n" in content
        assert f"--identity {root / 'cluster'}\n" in content  # a whole line, not wrapped at 80

        # The address is named as the agents start; the mesh answers there once it listens.
        argv = ("nodes", "--json", "--agent", address, "--identity", str(root / "cluster"))
        deadline = time.monotonic() + READY_S
        nodes = shoal(*argv)
        while nodes.returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.5)
            nodes = shoal(*argv)
        assert nodes.returncode == 0, nodes.stderr
        content = _wait_for(log, "Host", READY_S)  # the nodes table, once converged
        assert "Host" in content and "GPUs" in content, content

        demo.send_signal(signal.SIGTERM)
        _assert_stopped_cleanly(demo, root)
    finally:
        _kill_leftovers(demo, root)
