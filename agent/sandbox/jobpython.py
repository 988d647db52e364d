"""The Python a local mesh's own jobs run with (the demo's workload), wherever the agents run.

The demo's jobs are Python (:mod:`agent.sandbox.synthjob`, or a few lines of ``-c``), and they run
as the job user: with agents run as root, an unprivileged user (:mod:`agent.execution.jobuser`) that
often cannot run the agents' interpreter at all. A root's pyenv Python lives under ``/root``; its
binary may start, but its ``libpython`` cannot be read (exit 127 before any Python runs). So the
demo asks, once, as the job user itself: which interpreter of Python 3.11 or newer can it run, and
can it import Shoal's code from where it is installed? Tried in order: the agents' own interpreter,
the same version by name on the system's ``PATH``, then any ``python3``; each with Shoal as
installed, then with this checkout's source folder on ``PYTHONPATH``, then with a copy of Shoal's
pure-Python packages in the demo's own folder, readable by every user. The first that imports the
synthetic job is what every job of the run uses; none at all is one line saying who tried what.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from agent.common.errors import UserError
from agent.common.paths import source_root
from agent.execution.jobuser import SYSTEM_PATH, JobUser, lookup_job_user, resolve_job_user

PACKAGES: Final = ("agent", "gossip", "probers")
"""What a copy holds: the synthetic job's imports (the policy's model, the catalog)."""
PROBE: Final = "import sys, agent.sandbox.synthjob; sys.exit(sys.version_info < (3, 11))"
PROBE_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class JobPython:
    """An interpreter the job user can run, and the environment that finds Shoal's code."""

    executable: str
    env: Mapping[str, str] = field(default_factory=dict)


HERE: Final = JobPython(sys.executable)
"""The agents' own interpreter, as installed: right whenever jobs run as the agents' user."""


def _interpreters() -> Iterator[str]:
    seen: set[str] = set()
    major, minor = sys.version_info[:2]
    named = (shutil.which(n, path=SYSTEM_PATH) for n in (f"python{major}.{minor}", "python3"))
    for candidate in (sys.executable, *named):
        if candidate and candidate not in seen:
            seen.add(candidate)
            yield candidate


def _copy_packages(folder: Path) -> Path:
    """Shoal's pure-Python packages under ``folder/jobkit``, readable (not writable) by all."""
    kit = folder / "jobkit"
    if not kit.exists():
        for package in PACKAGES:
            shutil.copytree(
                source_root() / package,
                kit / package,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
        for path in (kit, *kit.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
    return kit


def _runs(candidate: JobPython, user: JobUser) -> bool:
    env = {"PATH": SYSTEM_PATH, "HOME": user.home, **candidate.env}
    try:
        done = subprocess.run(
            [candidate.executable, "-c", PROBE],
            env=env,
            cwd="/",
            user=user.uid,
            group=user.gid,
            extra_groups=list(user.groups),
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def job_python(folder: Path, job_user: str | None = None) -> JobPython:
    """The interpreter for jobs the agents of a local mesh in ``folder`` run (see the module)."""
    name = resolve_job_user(job_user)
    if name is None:
        return HERE
    user = lookup_job_user(name)
    if not user.switch:
        return HERE
    kit: Path | None = None
    tried: list[str] = []
    for executable in _interpreters():
        for where in ("installed", "source", "copy"):
            if where == "installed":
                env: dict[str, str] = {}
            elif where == "source":
                env = {"PYTHONPATH": str(source_root())}
            else:
                kit = kit or _copy_packages(folder)
                env = {"PYTHONPATH": str(kit)}
            candidate = JobPython(executable, env)
            if _runs(candidate, user):
                return candidate
        tried.append(executable)
    raise UserError(
        f"the demo's jobs run as {user.name}, who cannot run Python 3.11 or newer with Shoal's "
        f"code (tried {', '.join(tried)}); install python3 for all users, or set job_user"
    )
