"""Folders and files with the mode Shoal asks for, whatever the umask.

``os.mkdir(path, 0o700)`` and ``open(path, "w")`` take their mode through the process umask: under
``umask 000`` a folder made by ``mkdir(parents=True)`` is 0777 and a file 0666. Here every mode is
set explicitly on an open descriptor (``fchmod``), and the final component is opened with
``O_NOFOLLOW``, so a symlink planted where a folder should be is refused, never followed.

POSIX modes mean nothing on Windows: there the folders are only created.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from pathlib import Path

_WINDOWS = sys.platform == "win32"


def ensure_dir(path: Path, mode: int, *, uid: int | None = None, gid: int | None = None) -> None:
    """Make ``path`` a folder of ``mode`` (and owner ``uid``/``gid`` when given).

    Missing parents are created 0700. An existing folder is kept and its mode (and owner) set;
    something else at ``path`` (a file, a symlink) raises ``NotADirectoryError``, and a folder
    owned by another user than us or ``uid`` raises ``PermissionError``.
    """
    if _WINDOWS:
        path.mkdir(parents=True, exist_ok=True)
        return
    parent = path.parent
    if parent != path and not parent.exists():
        ensure_dir(parent, 0o700)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise NotADirectoryError(f"{path} is not a folder ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if st.st_uid not in (os.geteuid(), uid):
            raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to this user")
        if uid is not None:
            os.fchown(fd, uid, -1 if gid is None else gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def set_file_mode(path: Path, mode: int) -> None:
    """Set the mode of the regular file at ``path`` if it exists (never through a symlink)."""
    if _WINDOWS:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes, mode: int, *, exclusive: bool = False) -> None:
    """Write ``data`` to a new ``path`` of ``mode``; ``exclusive`` refuses an existing file
    (``FileExistsError``), else an existing one is replaced atomically (through a temporary)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    target = path if exclusive else path.with_name(path.name + ".tmp")
    if not exclusive:
        target.unlink(missing_ok=True)
    fd = os.open(target, flags, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            if not _WINDOWS:
                os.fchmod(f.fileno(), mode)
            f.write(data)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    if not exclusive:
        os.replace(target, path)
