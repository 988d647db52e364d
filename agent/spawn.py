"""Starting one job process: its own session, its user, its cgroup, death with the agent.

On Linux the job starts as ``setpriv --pdeathsig KILL -- sh -c GUARD AGENT_PID [sh -c ENTER
procs] [setpriv --reuid U --regid G --init-groups --pdeathsig KILL --] argv``, all in the one
process Python started: setpriv arms ``PR_SET_PDEATHSIG`` (an agent killed from then on takes the
job along), the guard checks that the process's parent is still the agent, the shell moves the
process into the attempt's cgroup while it still has the agent's privileges, and the second
setpriv switches to the job user and arms the signal again (the switch clears it).

The guard closes the launch's window: the death signal fires only for a parent that dies after
it is armed, so an agent killed between its fork and the arming would leave the job to start as
an orphan, beside the attempt its owner starts elsewhere. Armed first and checked after, one of
the two always holds: the parent died before the check (it is no longer the agent: the process
exits 125 without starting the job) or after the arming (the kernel kills it). What is left is
the user switch's own instant, inside setpriv between the switch and the second arming; there
the attempt's cgroup, where it has one, is what a restarted agent stops. The guard runs before
the switch, as the agent's user: setpriv finds the job's program with the agent's rights, which
a shell running as the job user would not have.

Python starts it with vfork and no Python code in the child: ~0.4 ms, against ~4 ms idle and
~20 ms busy for a ``preexec_fn`` (which makes Python fork the whole agent). The cgroup move and
the user switch happen in the child after Python's start has returned: they cost the agent nothing
(the guard adds ~0.8 ms of the child's, the cgroup's shell and the user switch ~1 ms each).

Without setpriv (Linux), a ``preexec_fn`` does the same four things. Elsewhere on POSIX (macOS)
Python's own ``user``/``group``/``extra_groups`` switch the user; there is no death signal and no
cgroup. Windows: a new process group, the agent's user.
"""

from __future__ import annotations

import asyncio
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

from agent.containment import CGROUP_ENTER
from agent.jobuser import JobUser

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
    if launcher:
        check_program(argv[0], env, cwd)  # setpriv would only fail after the start
        creds = (
            (f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups") if user.switch else ()
        )
        switch = (launcher[0], *creds, *launcher[1:]) if creds else ()
        guard = ("/bin/sh", "-c", PARENT_GUARD, str(os.getpid()))
        enter = () if cgroup_procs is None else ("/bin/sh", "-c", CGROUP_ENTER, str(cgroup_procs))
        argv = (*launcher, *guard, *enter, *switch, *argv)
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
    setpriv = shutil.which("setpriv")
    return (setpriv, "--pdeathsig", signal_name, "--") if setpriv else ()


def check_program(program: str, env: Mapping[str, str], cwd: str) -> None:
    """Raise the OSError exec would raise for a program that is missing or not executable."""
    if os.sep in program:
        path: str | None = os.path.join(cwd, program)
    else:
        path = shutil.which(program, path=env.get("PATH", os.defpath))
        if path is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    assert path is not None
    if not os.path.isfile(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)


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
