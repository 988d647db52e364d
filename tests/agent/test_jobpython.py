"""The demo's jobs run wherever the agents run: as root, the job user often cannot run the agents'
own interpreter (a root's pyenv Python under /root), and the demo finds one it can."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.execution.jobuser import SYSTEM_PATH, lookup_job_user, resolve_job_user
from agent.sandbox import jobpython
from agent.sandbox.jobpython import HERE, job_python
from tests.support import require_system

pytestmark = pytest.mark.system


def _job_user() -> str:
    require_system(os.geteuid() == 0, "needs root (jobs run as another user only under root)")
    name = resolve_job_user(None)
    assert name is not None
    return name


def test_the_agents_interpreter_is_kept_where_the_job_user_can_run_it(tmp_path: Path) -> None:
    _job_user()
    python = job_python(tmp_path)
    # This checkout's venv is reachable by all (CI's and this machine's): kept as it is, or,
    # where its interpreter lies under /root, replaced by one the job user can run.
    user = lookup_job_user(resolve_job_user(None))
    done = subprocess.run(
        [python.executable, "-c", "import agent.sandbox.synthjob"],
        env={"PATH": SYSTEM_PATH, **python.env},
        user=user.uid,
        group=user.gid,
        cwd="/",
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_an_interpreter_the_job_user_cannot_reach_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _job_user()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    hidden = private / "python"
    hidden.symlink_to(Path(sys.executable).resolve())
    monkeypatch.setattr(jobpython.sys, "executable", str(hidden))
    folder = tmp_path / "mesh"
    folder.mkdir(mode=0o711)
    python = job_python(folder)
    assert python != HERE
    assert python.executable != str(hidden)
    assert Path(python.executable).is_absolute()


def test_no_interpreter_at_all_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = _job_user()
    monkeypatch.setattr(jobpython, "_interpreters", lambda: iter(["/nonexistent/python3"]))
    with pytest.raises(jobpython.UserError, match=rf"run as {name}, who cannot run Python 3.11"):
        job_python(tmp_path)
