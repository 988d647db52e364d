"""One safe walk of a folder the agent reads for someone else (a dataset, a working folder).

Each folder is opened relative to its parent (``O_DIRECTORY | O_NOFOLLOW``) and each file likewise,
so no symbolic link is ever followed, however the tree changes while it is walked: a link, a FIFO,
a device or a socket is passed over and counted, as is a folder deeper than
:data:`~agent.content.manifest.MAX_DEPTH` or a name that is not a safe path. Entries come sorted,
folders depth first, so the same tree walks the same way.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.content.manifest import MAX_DEPTH, path_problem

_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS: Final = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW
READ_FLAGS: Final = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0)


@dataclass(frozen=True, slots=True)
class Found:
    """One regular file: its path below the top, its ``lstat``, and how to open it
    (``os.open(name, READ_FLAGS, dir_fd=dir_fd)``, valid only while the walk is at it)."""

    rel: str
    st: os.stat_result
    dir_fd: int
    name: str


@dataclass(slots=True)
class WalkCount:
    skipped: int = 0
    """Entries passed over: links, special files, too deep, unsafe names, unreadable folders."""


def walk_files(top: Path, count: WalkCount) -> Iterator[Found]:
    """The regular files under ``top`` (a folder), no link followed; nothing when ``top`` is
    not a folder that can be opened."""
    try:
        fd = os.open(top, _DIR_FLAGS)
    except OSError:
        return
    yield from _walk(fd, "", 0, count)


def _walk(fd: int, prefix: str, depth: int, count: WalkCount) -> Iterator[Found]:
    try:
        try:
            entries = sorted(os.scandir(fd), key=lambda e: e.name)
        except OSError:
            count.skipped += 1
            return
        for entry in entries:
            rel = prefix + entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                count.skipped += 1
                continue
            if path_problem(rel) is not None:
                count.skipped += 1
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 >= MAX_DEPTH:
                    count.skipped += 1
                    continue
                try:
                    sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    count.skipped += 1
                    continue
                yield from _walk(sub, rel + "/", depth + 1, count)
            elif stat.S_ISREG(st.st_mode):
                yield Found(rel, st, fd, entry.name)
            else:
                count.skipped += 1
    finally:
        os.close(fd)
