"""Who a job runs as, the environment it starts from, and which of the agent's files it can reach.

A job runs as the *job user*: when the agent runs as root, a dedicated unprivileged user
(``job_user`` in the agent's config; by default ``shoal-job`` where it exists, else ``nobody``).
An agent that is not root cannot switch users: its jobs run as its own user and can read
everything the agent can, its private key included (the agent says so in its log at startup).

The agent's folder, with a separate job user (the modes are set explicitly, whatever the umask)::

    <data_dir>/                 the agent's, 0711: the job user may pass through, not list
    <data_dir>/agent.sqlite*    0600
    <data_dir>/identity/        0700 (node.key 0600)
    <data_dir>/jobs/            the agent's, 0711
    <data_dir>/jobs/<job id>/   the job user's, 0700: its working folder, ``progress`` and
                                ``checkpoint/`` (also the job user's, 0700)
        output.log[.N]          the agent's, 0600, opened by the agent only through O_NOFOLLOW
    <data_dir>/checkpoints/     the agent's, 0700: which checkpoint of each job is held here
    (its bytes are in ``<data_dir>/store/``, ``agent.checkpoints.ckptstore``)

Without a separate job user, ``<data_dir>`` and ``jobs/`` are 0700. The agent reads a file the
job could have replaced (the progress file) only without following symlinks, without blocking on
a FIFO, only when the job user owns it, and at most a few KiB of it.

A job's environment starts clean, not from the agent's (which may hold secrets): ``LANG``,
``LANGUAGE``, ``LC_*``, ``TZ`` and ``TMPDIR`` as the agent has them; ``PATH`` as the agent has it
when the job runs as the agent's own user, else the system's (:data:`SYSTEM_PATH`, as sudo's
``secure_path``: the agent's may name folders the job user cannot enter, a root's pyenv shims
say); ``HOME``, ``USER`` and ``LOGNAME`` of the job user; then the job's own ``env`` (which may set
``PATH``); then Shoal's variables. Only the job sees them, never the launch before the user
switch (``agent.execution.jobenv``).
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from gossip.fsmodes import ensure_dir

log = logging.getLogger("shoal.executor")

DEFAULT_JOB_USERS: Final = ("shoal-job", "nobody")
"""Tried in order when the agent runs as root and ``job_user`` is not set."""

_PASSED: Final = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR"})
_WINDOWS_PASSED: Final = frozenset(
    {
        "PATH",
        "PATHEXT",
        "SYSTEMROOT",
        "SYSTEMDRIVE",
        "WINDIR",
        "COMSPEC",
        "TEMP",
        "TMP",
        "USERPROFILE",
        "USERNAME",
        "HOMEDRIVE",
        "HOMEPATH",
        "APPDATA",
        "LOCALAPPDATA",
        "PROGRAMDATA",
        "PROGRAMFILES",
        "NUMBER_OF_PROCESSORS",
        "PROCESSOR_ARCHITECTURE",
        "OS",
    }
)
_DEFAULT_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
SYSTEM_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_READ_LIMIT_BYTES: Final = 4096


@dataclass(frozen=True, slots=True)
class JobUser:
    """The user jobs run as."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...]
    """Supplementary groups (``initgroups``)."""
    switch: bool
    """Whether it differs from the agent's own user (the agent then drops to it at each start)."""


def agent_is_root() -> bool:
    return sys.platform != "win32" and os.geteuid() == 0


def resolve_job_user(configured: str | None) -> str | None:
    """``AgentConfig.job_user`` to ``ExecutorConfig.job_user``: ``None`` picks the default (a
    dedicated user when the agent is root, else the agent's own), ``""`` means the agent's own
    user, anything else names one. Raises ``ValueError`` for a user the agent cannot switch to."""
    if sys.platform == "win32":
        if configured:
            raise ValueError("job_user: jobs run as the agent's user on Windows")
        return None
    if configured == "":
        return None
    if not agent_is_root():
        if configured is None or configured == _own_name():
            return None
        raise ValueError(
            f"job_user {configured!r}: the agent runs as {_own_name()!r} and cannot switch users "
            "(run it as root, or leave job_user unset)"
        )
    if configured is not None:
        return configured
    import pwd

    for name in DEFAULT_JOB_USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise ValueError(
        "no user to run jobs as: create a 'shoal-job' user, or set job_user "
        '(job_user = "" runs jobs as root)'
    )


def lookup_job_user(name: str | None) -> JobUser:
    """The :class:`JobUser` named ``name`` (``None``: the agent's own user)."""
    if sys.platform == "win32":
        user = os.environ.get("USERNAME", "")
        return JobUser(user, -1, -1, os.environ.get("USERPROFILE", ""), (), switch=False)
    import pwd

    if name is None:
        try:
            entry = pwd.getpwuid(os.geteuid())
        except KeyError:  # a uid without a passwd entry (some containers)
            uid, home = os.geteuid(), os.environ.get("HOME", "/")
            return JobUser(str(uid), uid, os.getegid(), home, (), switch=False)
    else:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ValueError(f"job user {name!r} does not exist") from None
    switch = entry.pw_uid != os.geteuid()
    if switch and not agent_is_root():
        raise ValueError(f"job user {name!r}: only an agent running as root can switch users")
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid)) if switch else ()
    return JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, groups, switch)


def _own_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def log_job_user(user: JobUser, cage: str, blocked: Path | None) -> None:
    """Say at startup who jobs run as, how they are contained, and what they cannot reach."""
    if user.switch:
        log.info("jobs run as user %s, not as the agent's user; contained by %s", user.name, cage)
    elif agent_is_root():
        log.warning("jobs run as root, with the agent's privileges (job_user is empty)")
    else:
        log.warning(
            "jobs run as the agent's own user %s: the agent is not root, so it cannot switch "
            "users, and a job can read the agent's identity and data; contained by %s",
            user.name,
            cage,
        )
    if blocked is not None:
        log.warning(
            "jobs run as %s cannot pass through %s: $SHOAL_PROGRESS_FILE and "
            "$SHOAL_CHECKPOINT_DIR will not work for them (chmod o+x %s lets them)",
            user.name,
            blocked,
            blocked,
        )


def base_env(user: JobUser, agent_env: Mapping[str, str]) -> dict[str, str]:
    """The variables every job of ``user`` starts from (see the module docstring)."""
    if sys.platform == "win32":
        return {k: v for k, v in agent_env.items() if k.upper() in _WINDOWS_PASSED}
    env = {k: v for k, v in agent_env.items() if k in _PASSED or k.startswith("LC_")}
    if user.switch:
        env["PATH"] = SYSTEM_PATH
    env.setdefault("PATH", _DEFAULT_PATH)
    env["HOME"] = user.home
    env["USER"] = env["LOGNAME"] = user.name
    return env


def prepare_jobs_folder(data_dir: Path, user: JobUser) -> Path:
    """Make ``data_dir`` and ``data_dir/jobs`` with their modes and return the latter; raises
    ``ValueError`` (one line) when they cannot be the agent's own."""
    mode = 0o711 if user.switch else 0o700
    jobs = data_dir / "jobs"
    try:
        ensure_dir(data_dir, mode)
        ensure_dir(jobs, mode)
    except OSError as exc:
        raise ValueError(f"data folder {data_dir}: {exc}") from None
    return jobs


def prepare_job_folder(path: Path, user: JobUser) -> None:
    """Make ``path`` (or a folder the job left in it) the job user's own folder, 0700."""
    if not user.switch:
        ensure_dir(path, 0o700)
        return
    try:
        ensure_dir(path, 0o700, uid=user.uid, gid=user.gid)
    except NotADirectoryError:  # a previous attempt put a file or a symlink there
        path.unlink()
        ensure_dir(path, 0o700, uid=user.uid, gid=user.gid)


def unreachable(path: Path, user: JobUser) -> Path | None:
    """The first folder above or at ``path`` the job user may not pass through, if any."""
    if not user.switch:
        return None
    for folder in reversed((path.resolve(), *path.resolve().parents)):
        try:
            st = folder.stat()
        except OSError:
            return folder
        if not user_may(user, st, "x"):
            return folder
    return None


_BITS: Final = {
    "r": (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH),
    "x": (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH),
}


def user_may(user: JobUser, st: os.stat_result, what: Literal["r", "x"]) -> bool:
    """Whether ``user`` may read (``r``) or execute or pass through (``x``) a file of ``st``, by
    its owner, group and mode (as the kernel decides it, ACLs aside)."""
    usr, grp, oth = _BITS[what]
    if user.uid == 0:
        return what == "r" or stat.S_ISDIR(st.st_mode) or bool(st.st_mode & (usr | grp | oth))
    if st.st_uid == user.uid:
        return bool(st.st_mode & usr)
    if st.st_gid == user.gid or st.st_gid in user.groups:
        return bool(st.st_mode & grp)
    return bool(st.st_mode & oth)


def read_job_file(
    path: Path, owner_uid: int, unless: tuple[int, int] | None = None
) -> tuple[tuple[int, int], bytes] | None:
    """The first few KiB of a file a job writes, with its ``(mtime_ns, size)`` stamp.

    ``None`` when it is missing, not a regular file, not ``owner_uid``'s (a job may have planted
    a symlink, a hard link or a FIFO there), or still has the stamp ``unless``.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if sys.platform != "win32" and st.st_uid != owner_uid:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == unless:
            return None
        return stamp, os.read(fd, _READ_LIMIT_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
