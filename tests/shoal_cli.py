"""Running the real ``shoal`` command in a subprocess, as an operator would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

SHOAL = [sys.executable, "-m", "agent.cli"]
"""``shoal`` as the tests run it (the console script runs the same ``main``)."""


def shoal(
    *args: str,
    timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``shoal ARGS...`` to its end; stdout and stderr captured as text."""
    return subprocess.run(
        [*SHOAL, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a refused command (exit 2, no traceback), for more checks."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def into_closed_pipe(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``shoal ARGS...`` with stdout a pipe whose reader is already gone (``| head`` that has
    read enough): every write meets EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [*SHOAL, *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    finally:
        os.close(write_end)
