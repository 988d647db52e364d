"""Starting one job process: its own session, its user, its cgroup, death with the agent.

On Linux the job starts as ``setpriv --pdeathsig KILL -- /bin/sh -c GUARD AGENT_PID [/bin/sh -c
ENTER procs] [setpriv --reuid U --regid G --init-groups --pdeathsig KILL --] /bin/sh -c SET sh
argv``, all in the one process Python started: setpriv arms ``PR_SET_PDEATHSIG`` (an agent killed
from then on takes the job along), the guard checks that the process's parent is still the agent,
the shell moves the process into the attempt's cgroup while it still has the agent's privileges,
the second setpriv switches to the job user and arms the signal again (the switch clears it), and
the last shell, already the job user, sets the job's environment and execs the job. Everything
before it runs with a fixed environment and absolute program paths: the job's variables never
reach a process with the agent's rights (``agent.execution.jobenv``).

The guard closes the launch's window: the death signal fires only for a parent that dies after
it is armed, so an agent killed between its fork and the arming would leave the job to start as
an orphan, beside the attempt its owner starts elsewhere. Armed first and checked after, one of
the two always holds: the parent died before the check (it is no longer the agent: the process
exits 125 without starting the job) or after the arming (the kernel kills it). What is left is
the user switch's own instant, inside setpriv between the switch and the second arming; there
the attempt's cgroup, where it has one, is what a restarted agent stops.

The job's program is looked up and exec'd by the job user (a bare name in the job's ``PATH``):
before the start, :func:`check_program` checks, with the job user's rights, that it may reach,
execute and (a script) read it and run its interpreter, so that a program it cannot run fails the
launch with one line saying why, not with a bare exit 127.

Python starts it with vfork and no Python code in the child: ~0.4 ms, against ~4 ms idle and
~20 ms busy for a ``preexec_fn`` (which makes Python fork the whole agent). The cgroup move and
the user switch happen in the child after Python's start has returned: they cost the agent nothing
(the guard adds ~0.8 ms of the child's, the cgroup's shell, the user switch and the shell that
sets the job's environment ~1 ms each).

Without setpriv (Linux), a ``preexec_fn`` does the same four things; the job's environment is
then set by the ``execve`` that runs the job, after the switch. Elsewhere on POSIX (macOS)
Python's own ``user``/``group``/``extra_groups`` switch the user; there is no death signal and no
cgroup. Windows: a new process group, the agent's user.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from agent.execution.containment import CGROUP_ENTER
from agent.execution.jobenv import SHELL, after_switch
from agent.execution.jobuser import SYSTEM_PATH, JobUser, unreachable, user_may

PARENT_GUARD: Final = (
    '[ "$PPID" = "$0" ] || { echo "shoal: the agent is gone: not starting" >&2; exit 125; }; '
    'exec "$@"'
)
"""The ``sh -c`` script, run once the death signal is armed, that execs the rest only while the
process's parent is still the agent (``$0``, its pid)."""


async def spawn(
    protocol: asyncio.SubprocessProtocol,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    *,
    user: JobUser,
    cgroup_procs: Path | None,
    launcher: Sequence[str],
) -> asyncio.SubprocessTransport:
    """Start ``argv`` in a new session (see the module docstring); ``launcher`` is
    :func:`death_signal_launcher`'s answer (empty: no setpriv)."""
    loop = asyncio.get_running_loop()
    options: dict[str, Any] = {
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.STDOUT,
        "env": dict(env),
        "cwd": cwd,
    }
    if sys.platform == "win32":
        options["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP
        transport, _ = await loop.subprocess_exec(lambda: protocol, *argv, **options)
        return transport
    options["start_new_session"] = True
    # Exec would only fail after the start (in setpriv, as the job user: a bare exit 127).
    check_program(argv[0], env, cwd, user)
    if launcher:
        handover = after_switch(env)
        options["env"] = dict(handover.env)
        creds = (
            (f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups") if user.switch else ()
        )
        switch = (launcher[0], *creds, *launcher[1:]) if creds else ()
        guard = (SHELL, "-c", PARENT_GUARD, str(os.getpid()))
        enter = () if cgroup_procs is None else (SHELL, "-c", CGROUP_ENTER, str(cgroup_procs))
        argv = (*launcher, *guard, *enter, *switch, *handover.argv, *argv)
    elif sys.platform.startswith("linux"):
        options["preexec_fn"] = _child_setup(user, cgroup_procs)
    elif user.switch:
        options.update(user=user.uid, group=user.gid, extra_groups=list(user.groups))
    transport, _ = await loop.subprocess_exec(lambda: protocol, *argv, **options)
    return transport


def use_pidfd_child_watcher() -> None:
    """Have asyncio wait for job processes through pidfds (Linux 5.3+) on Python 3.11.

    3.11's default watcher starts a thread for every child and waits for it to run: ~2 ms per
    job start on an idle machine, far more on a busy one. 3.12 uses pidfds by itself.
    Call before the event loop starts.
    """
    if sys.platform != "linux" or sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # a kernel without pidfds, or a sandbox that refuses them
        return
    asyncio.set_child_watcher(asyncio.PidfdChildWatcher())


@functools.cache
def death_signal_launcher(signal_name: str = "KILL") -> tuple[str, ...]:
    """``setpriv --pdeathsig KILL --`` (util-linux) where it exists, else nothing.

    The job's leader must get SIGKILL if the agent dies (``PR_SET_PDEATHSIG``): without it a
    job that never writes would outlive a ``kill -9`` of its agent and could run beside the
    attempt its owner starts elsewhere. setpriv sets it and execs the job, in the same process.
    (A local mesh's agents get SIGTERM when the process that started them dies.)
    """
    if not sys.platform.startswith("linux"):
        return ()
    # Looked for in the system's folders only, by absolute path: it runs with the agent's
    # rights, and the agent's own PATH may name a folder someone else can write.
    setpriv = shutil.which("setpriv", path=SYSTEM_PATH)
    return (os.path.abspath(setpriv), "--pdeathsig", signal_name, "--") if setpriv else ()


class Unreachable(ValueError):
    """The job user may not run the job's program; the message says why, in one line."""


def check_program(program: str, env: Mapping[str, str], cwd: str, user: JobUser) -> None:
    """Raise what exec would fail with, as the job user, before the start: ``OSError`` for a
    program that is missing (or, run as the agent's own user, not executable), and
    :class:`Unreachable` for one the job user may not reach, execute or (a script) read, or
    whose script interpreter it may not run."""
    if os.sep in program:
        path = os.path.join(cwd, program)
        if not os.path.isfile(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        problem = _runs_problem(user, path)
        if problem is not None:
            raise problem
        return
    denied: Exception | None = None
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(cwd, folder or os.curdir, program)
        if not os.path.isfile(path):
            continue
        problem = _runs_problem(user, path)
        if problem is None:
            return
        denied = denied or problem  # as execvp: the next folder may hold one it may run
    if denied is not None:
        raise denied
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def _runs_problem(
    user: JobUser, path: str, *, interpreter_of: str | None = None
) -> Exception | None:
    """Why ``user`` cannot run the regular file ``path`` (``None``: it can)."""
    if not user.switch:
        if not os.access(path, os.X_OK):
            return PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return None
    what = f"{path}, the interpreter of {interpreter_of}" if interpreter_of else path
    denied = f"the job user {user.name} cannot execute {what}: permission denied"
    real = os.path.realpath(path)
    for folder in dict.fromkeys((os.path.dirname(os.path.abspath(path)), os.path.dirname(real))):
        blocked = unreachable(Path(folder), user)
        if blocked is not None:
            return Unreachable(f"{denied} (it cannot pass through {blocked})")
    try:
        st = os.stat(real)
    except OSError as exc:
        return Unreachable(f"{denied} ({exc.strerror})")
    if not user_may(user, st, "x"):
        return Unreachable(denied)
    if interpreter_of is not None:
        return None
    interpreter = _interpreter(real)
    if interpreter is None:
        return None
    if not user_may(user, st, "r"):
        return Unreachable(
            f"the job user {user.name} cannot read {path}: permission denied (a script: its"
            f" interpreter {interpreter} reads it)"
        )
    if not os.path.isfile(interpreter):
        return Unreachable(f"the interpreter of {path}, {interpreter}, does not exist")
    return _runs_problem(user, interpreter, interpreter_of=path)


def _interpreter(path: str) -> str | None:
    """The interpreter a ``#!`` line names, if the file starts with one."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    return os.fsdecode(words[0]) if words else None


def _child_setup(user: JobUser, cgroup_procs: Path | None) -> Callable[[], None]:
    """The ``preexec_fn`` where setpriv is missing (Linux): the cgroup, the user, then
    ``PR_SET_PDEATHSIG`` (a credential change clears it, so it comes last), then the guard."""
    import ctypes

    try:
        prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None
    pr_set_pdeathsig = 1
    procs = str(cgroup_procs).encode() if cgroup_procs is not None else None
    agent_pid = os.getpid()

    def setup() -> None:
        if procs is not None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        if user.switch:
            os.setgroups(list(user.groups))
            os.setgid(user.gid)
            os.setuid(user.uid)
        if prctl is not None:
            prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != agent_pid:  # the agent died before the arming: see PARENT_GUARD
                os._exit(125)

    return setup


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def signal_group(
    pgid: int | None,
    pid: int | None,
    transport: asyncio.SubprocessTransport | None,
    name: str,
    *,
    leftovers: bool = False,
) -> None:
    """Send the named signal to a job's whole process group; missing processes are fine. On
    Windows (no groups) the leader's tree: ``taskkill /T`` for SIGKILL, else CTRL_BREAK;
    ``leftovers`` (the leader is gone) has nothing to sweep there."""
    if sys.platform == "win32":
        if leftovers or transport is None:
            return  # Windows has no group to sweep once the leader is gone
        try:
            if name == "SIGKILL":
                subprocess.run(
                    ["taskkill", "/F", "/T", "/PID", str(pid)],
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
                transport.kill()
            else:
                transport.send_signal(signal.CTRL_BREAK_EVENT)
        except (OSError, subprocess.SubprocessError):
            pass
        return
    assert pgid is not None
    sig = getattr(signal, name, signal.SIGTERM)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
