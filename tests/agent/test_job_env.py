"""A job's environment acts only as the job user: every loader and interpreter variable, against
every launcher (setpriv, the preexec_fn, each with a cgroup or the subreaper), real processes,
an agent as root and jobs as nobody. Each variable is set the way a hostile job would set it (a
library or script in a folder every job may write) and must reach the job, and act in it, and in
no process that runs as root."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import agent.execution.executor
from agent.execution.containment import open_cage
from agent.execution.executor import Exited, ProcessExecutor
from agent.execution.jobenv import CARRIER_PREFIX, LAUNCHER_ENV, after_switch, checked_env
from agent.execution.jobuser import SYSTEM_PATH, lookup_job_user
from agent.execution.launch import ExecutorConfig, Launch, LaunchError
from agent.execution.spawn import check_program, death_signal_launcher
from agent.job.jobspec import JobSpec, new_job_id
from tests.support import require_system

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="setpriv, cgroups: Linux"),
]

NOBODY = 65534
SPY_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void spy(void) {
    char exe[256] = "?";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0;
    char line[400];
    int len = snprintf(line, sizeof line, "uid=%d exe=%s\n", (int)geteuid(), exe);
    int fd = open(SPY_LOG, O_WRONLY | O_APPEND | O_CREAT, 0666);
    if (fd >= 0) { if (write(fd, line, len) < 0) {} close(fd); }
}
unsigned int la_version(unsigned int version) { return version; }
"""
"""A library that says, in the spy log, who loaded it (``la_version``: it also serves as an
``LD_AUDIT`` module)."""

SPY_SH = 'echo "uid=$(/usr/bin/id -u) exe=$0" >>{log}\n'
PRINT_ENV = "import json, os; print('ENV', json.dumps(dict(os.environ)))"


def require_root_nobody_and(*programs: str) -> None:
    require_system(os.geteuid() == 0, "root, to run jobs as nobody")
    for program in programs:
        require_system(shutil.which(program) is not None, f"{program}, to build the test's traps")


def job_python() -> str:
    """A Python nobody may run (this test's own may sit in /root, as a pyenv's does)."""
    nobody = lookup_job_user("nobody")
    for candidate in (sys.executable, shutil.which("python3", path=SYSTEM_PATH)):
        if candidate is None:
            continue
        try:
            check_program(candidate, {}, "/", nobody)
        except (OSError, ValueError):
            continue
        return candidate
    require_system(False, "a Python the user nobody may run")
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Traps:
    """A folder every job may write (1777), holding what a hostile job leaves there."""

    root: Path
    log: Path
    """Where every trap says who ran it: ``uid=N exe=PATH`` lines."""

    @property
    def spy(self) -> Path:
        return self.root / "spy.so"

    @property
    def libs(self) -> Path:
        """Holds a ``libcap-ng.so.0`` (setpriv needs one) that is the spy."""
        return self.root / "lib"

    @property
    def bin(self) -> Path:
        """Holds ``sh``, ``setpriv``, ``env``, ``id``, ``true``... that say who ran them."""
        return self.root / "bin"

    @property
    def site(self) -> Path:
        """Holds a ``sitecustomize.py`` (what Python runs at start from ``PYTHONPATH``)."""
        return self.root / "site"

    @property
    def script(self) -> Path:
        """A shell script (``BASH_ENV``, ``ENV``)."""
        return self.root / "rc.sh"

    @property
    def debug(self) -> Path:
        return self.root / "debug"

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def reset(self) -> None:
        self.log.write_text("")
        self.log.chmod(0o666)
        shutil.rmtree(self.debug, ignore_errors=True)
        self.debug.mkdir(mode=0o777)
        self.debug.chmod(0o777)


def lay_traps(root: Path) -> Traps:
    traps = Traps(root, root / "spy.log")
    root.chmod(0o1777)
    source = root / "spy.c"
    source.write_text(SPY_C)
    build = ["gcc", "-shared", "-fPIC", f'-DSPY_LOG="{traps.log}"', "-o", str(traps.spy)]
    subprocess.run([*build, str(source)], check=True, capture_output=True)
    # setpriv links libcap-ng: a stand-in with the functions it calls, that is the spy too.
    traps.libs.mkdir()
    setpriv = shutil.which("setpriv") or "setpriv"
    wanted = subprocess.run(
        ["nm", "-D", "--undefined-only", setpriv], capture_output=True, text=True, check=False
    ).stdout.split()
    stubs = "".join(f"int {n}(void) {{ return 0; }}\n" for n in wanted if n.startswith("capng_"))
    (root / "capng.c").write_text(SPY_C + stubs)
    fake = traps.libs / "libcap-ng.so.0"
    subprocess.run([*build[:-1], str(fake), str(root / "capng.c")], check=True, capture_output=True)
    traps.bin.mkdir()
    for name in ("sh", "dash", "bash", "setpriv", "env", "id", "echo", "cat", "true", "python3"):
        real = shutil.which(name, path=SYSTEM_PATH)
        if real is None:
            continue
        trap = traps.bin / name
        trap.write_text(f'#!/bin/dash\n{SPY_SH.format(log=traps.log)}exec {real} "$@"\n')
        trap.chmod(0o755)
    traps.site.mkdir()
    (traps.site / "sitecustomize.py").write_text(
        "import os, sys\n"
        f"with open({str(traps.log)!r}, 'a') as f:\n"
        "    f.write(f'uid={os.geteuid()} exe={sys.executable}\\n')\n"
    )
    traps.script.write_text(SPY_SH.format(log=traps.log))
    for path in (traps.spy, fake, traps.script, traps.site, traps.libs, traps.bin):
        path.chmod(0o755)
    traps.reset()
    return traps


@pytest.fixture(scope="module")
def traps() -> Iterator[Traps]:
    require_root_nobody_and("gcc", "nm", "setpriv")
    root = Path(tempfile.mkdtemp(prefix="shoal-traps-", dir="/tmp"))
    try:
        yield lay_traps(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Case:
    env: dict[str, str]
    argv: tuple[str, ...]
    acts_in_job: bool
    """Whether the trap runs in the job itself (the variable is the job's to use)."""


VARIABLES = (
    "BASH_ENV",
    "ENV",
    "LD_AUDIT",
    "LD_DEBUG_OUTPUT",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "PATH",
    "PYTHONPATH",
)


def cases(traps: Traps, python: str) -> dict[str, Case]:
    py = (python, "-c", PRINT_ENV)
    in_shell = shlex.join(py)
    return {
        "LD_PRELOAD": Case({"LD_PRELOAD": str(traps.spy)}, py, True),
        "LD_AUDIT": Case({"LD_AUDIT": str(traps.spy)}, py, True),
        "LD_LIBRARY_PATH": Case({"LD_LIBRARY_PATH": str(traps.libs)}, py, False),
        "LD_DEBUG_OUTPUT": Case(
            {"LD_DEBUG": "files", "LD_DEBUG_OUTPUT": str(traps.debug / "ld")}, py, True
        ),
        "PYTHONPATH": Case({"PYTHONPATH": str(traps.site)}, py, True),
        "BASH_ENV": Case({"BASH_ENV": str(traps.script)}, ("/bin/bash", "-c", in_shell), True),
        "ENV": Case({"ENV": str(traps.script)}, ("/bin/sh", "-i", "-c", in_shell), True),
        # A bare name, found in the job's PATH: the job's own choice, run as the job.
        "PATH": Case({"PATH": f"{traps.bin}:{SYSTEM_PATH}"}, ("python3", "-c", PRINT_ENV), True),
    }


LAUNCHERS = {
    "setpriv": ("subreaper", True),
    "setpriv+cgroup": ("cgroup", True),
    "preexec": ("subreaper", False),
    "preexec+cgroup": ("cgroup", False),
}


@pytest.fixture(params=sorted(LAUNCHERS))
async def executor(
    request: pytest.FixtureRequest, traps: Traps, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ProcessExecutor]:
    cage, setpriv = LAUNCHERS[request.param]
    data = traps.root / "data"
    try:
        open_cage(cage, data).close()  # type: ignore[arg-type]
    except ValueError as exc:
        require_system(False, f"containment {cage}: {exc}")
    if not setpriv:
        monkeypatch.setattr(agent.execution.executor, "_death_signal_launcher", lambda: ())
    config = ExecutorConfig(data_dir=data, grace_s=5.0, job_user="nobody", containment=cage)  # type: ignore[arg-type]
    ex = ProcessExecutor(config)
    assert ex.user.uid == NOBODY and ex.cage.mode == cage
    yield ex
    await asyncio.wait_for(ex.close(), 20)


async def run(ex: ProcessExecutor, launch: Launch) -> tuple[Exited, list[str]]:
    await ex.start(launch)
    exited = await asyncio.wait_for(ex.wait(launch.job_id), 30)
    return exited, ex.tail(launch.job_id, 400)


def env_of(lines: list[str]) -> dict[str, str]:
    found = [line for line in lines if line.startswith("ENV ")]
    assert found, lines
    env: dict[str, str] = json.loads(found[0][4:])
    return env


@pytest.mark.parametrize("variable", VARIABLES)
async def test_a_loader_or_interpreter_variable_acts_only_as_the_job_user(
    executor: ProcessExecutor, traps: Traps, variable: str
) -> None:
    case = cases(traps, job_python())[variable]
    traps.reset()
    launch = Launch(job_id=new_job_id(), attempt=1, argv=case.argv, env=case.env)
    exited, lines = await run(executor, launch)
    assert exited.ok, lines
    for name, value in case.env.items():
        assert env_of(lines)[name] == value  # the job has it as it asked
    said = traps.lines() + [
        f"uid={p.stat().st_uid} exe={p.name}" for p in sorted(traps.debug.iterdir())
    ]
    as_root = [line for line in said if not line.startswith(f"uid={NOBODY} ")]
    assert as_root == [], f"{variable} acted with the agent's rights"
    if case.acts_in_job:
        assert said, f"{variable} did not act in the job"


async def test_values_reach_the_job_exactly_and_no_launcher_variable_is_left(
    executor: ProcessExecutor,
) -> None:
    hostile = {
        "QUOTES": "a'b\"c`id`$(id)${HOME}\\n",
        "LINES": "one\ntwo\n",
        "SPACES": "  lead and trail  ",
        "EMPTY": "",
        "IFS": ":",
        "PATH": f"/nonexistent:{SYSTEM_PATH}",
    }
    launch = Launch(
        job_id=new_job_id(), attempt=1, argv=(job_python(), "-c", PRINT_ENV), env=hostile
    )
    exited, lines = await run(executor, launch)
    assert exited.ok, lines
    env = env_of(lines)
    assert {k: env.get(k) for k in hostile} == hostile
    assert not [k for k in env if k.startswith(CARRIER_PREFIX)]


async def test_a_variable_the_shell_refuses_fails_the_start_saying_which(
    executor: ProcessExecutor,
) -> None:
    launch = Launch(
        job_id=new_job_id(), attempt=1, argv=(job_python(), "-c", PRINT_ENV), env={"OPTIND": "x"}
    )
    if agent.execution.executor._death_signal_launcher():
        exited, lines = await run(executor, launch)
        assert exited.exit_code == 125
        assert any("the job's env cannot set OPTIND" in line for line in lines), lines
    else:  # the preexec_fn sets it at the exec itself: any value goes
        exited, lines = await run(executor, launch)
        assert exited.ok and env_of(lines)["OPTIND"] == "x"


# -- the job user's program ----------------------------------------------------------------------


@pytest.fixture
def private(traps: Traps) -> Iterator[Path]:
    """A folder nobody may not pass through, holding a program nobody could otherwise run."""
    folder = Path(tempfile.mkdtemp(prefix="shoal-private-", dir="/tmp"))
    folder.chmod(0o700)
    (folder / "train.sh").write_text("#!/bin/sh\necho trained\n")
    (folder / "train.sh").chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


async def test_a_program_the_job_user_cannot_reach_fails_saying_why(
    executor: ProcessExecutor, private: Path, traps: Traps
) -> None:
    program = private / "train.sh"
    launch = Launch(job_id=new_job_id(), attempt=1, argv=(str(program),))
    with pytest.raises(LaunchError) as info:
        await executor.start(launch)
    assert str(info.value) == (
        f"the job user nobody cannot execute {program}: permission denied"
        f" (it cannot pass through {private})"
    )
    assert executor.tail(launch.job_id, 1) == [f"[shoal] attempt 1 {info.value}"]
    # A script nobody may run but not read; an interpreter it may not run.
    open_dir = traps.root / "scripts"
    open_dir.mkdir(exist_ok=True)
    unreadable = open_dir / "unreadable.sh"
    unreadable.write_text("#!/bin/sh\necho hi\n")
    unreadable.chmod(0o711)
    shutil.copy(job_python(), private / "python")
    via = open_dir / "via.py"
    via.write_text(f"#!{private / 'python'}\nprint('hi')\n")
    via.chmod(0o755)
    for argv, said in (
        ((str(unreadable),), f"the job user nobody cannot read {unreadable}: permission denied"),
        (
            (str(via),),
            f"the job user nobody cannot execute {private / 'python'}, the interpreter of {via}:"
            f" permission denied (it cannot pass through {private})",
        ),
        (
            ("train.sh",),  # found in the job's PATH
            f"the job user nobody cannot execute {program}: permission denied"
            f" (it cannot pass through {private})",
        ),
    ):
        launch = Launch(job_id=new_job_id(), attempt=1, argv=argv, env={"PATH": str(private)})
        with pytest.raises(LaunchError) as info:
            await executor.start(launch)
        assert str(info.value).startswith(said)


# -- the rule itself -----------------------------------------------------------------------------


def test_names_no_launcher_can_hand_over_are_refused_in_one_line() -> None:
    for name in ("", "1ABC", "A.B", "A-B", "A B", "A=B", "Ä"):
        with pytest.raises(ValueError, match="is not a variable name") as info:
            checked_env({name: "x"})
        assert "\n" not in str(info.value)
        with pytest.raises(ValueError, match="env: "):
            JobSpec.from_dict({"command": ["x"], "env": {name: "x"}})
    with pytest.raises(ValueError, match="NUL"):
        checked_env({"A": "x\x00y"})
    with pytest.raises(ValueError, match="are Shoal's"):
        after_switch({f"{CARRIER_PREFIX}0": "x"})
    assert JobSpec.from_dict({"command": ["x"], "env": {"_Ok_1": "x"}}).env == {"_Ok_1": "x"}


def test_the_chain_carries_no_job_variable_under_its_own_name() -> None:
    handover = after_switch({"LD_PRELOAD": "/tmp/evil.so", "PATH": "/tmp/bin", "X": "$(id)"})
    assert dict(handover.env) == {
        **LAUNCHER_ENV,
        f"{CARRIER_PREFIX}0": "/tmp/evil.so",
        f"{CARRIER_PREFIX}1": "/tmp/bin",
        f"{CARRIER_PREFIX}2": "$(id)",
    }
    assert handover.argv[0] == "/bin/sh"
    assert not any("/tmp/" in word or "$(id)" in word for word in handover.argv)


def test_setpriv_is_found_in_the_systems_folders_whatever_the_agents_path(
    traps: Traps, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{traps.bin}:{os.environ.get('PATH', '')}")
    death_signal_launcher.cache_clear()
    try:
        launcher = death_signal_launcher()
    finally:
        death_signal_launcher.cache_clear()
    assert launcher and os.path.isabs(launcher[0])
    assert not launcher[0].startswith(str(traps.root))
