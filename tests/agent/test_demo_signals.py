"""``shoal demo`` as a service manager or a script runs it: stdout not a terminal, stopped by
SIGTERM or SIGHUP. It says how to reach the mesh, and stopping it leaves no agent and no folder
(the CA key was in it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.shoal_cli import SHOAL, shoal

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
        assert demo.wait(timeout=60) == 0
        assert demo.stderr is not None and "Traceback" not in demo.stderr.read()
        assert not root.exists()
        assert _agents_of(root) == []
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        if root is not None:
            for process in _agents_of(root):
                os.killpg(process.pid, signal.SIGKILL)
