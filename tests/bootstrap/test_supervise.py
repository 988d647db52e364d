"""The supervisor of hosts without systemd or launchd: a failure is restarted, a clean exit is
not (as systemd's Restart=on-failure), and its pidfile goes with it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

SUPERVISE = [sys.executable, "-m", "agent.bootstrap.supervise"]


def test_a_failing_command_is_restarted_and_a_clean_exit_ends_the_supervisor(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    pidfile = tmp_path / "agent.pid"
    # Fails the first time, exits 0 the second.
    script = (
        f"import pathlib, sys; p = pathlib.Path({str(runs)!r}); n = len(p.read_text()) "
        "if p.exists() else 0; p.write_text('x' * (n + 1)); sys.exit(3 if n == 0 else 0)"
    )
    started = time.monotonic()
    done = subprocess.run(
        [*SUPERVISE, "--pidfile", str(pidfile), "--", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert runs.read_text() == "xx"  # restarted once after the failure, not after the exit 0
    assert "exited with status 3" in done.stderr and "not restarting" in done.stderr
    assert not pidfile.exists()
    assert time.monotonic() - started < 10
