"""A job that fills its agent's disk is stopped, and what it wrote there removed.

Every job's folder (``jobs/<id>/``: its working folder unless its spec names another, its
``$SHOAL_CHECKPOINT_DIR`` unless its spec names another, its log) lies on the disk of the
agent's data folder, beside the agent's SQLite store. What a job writes there can fill it: its
log too, on a disk smaller than the log's bound (``agent.execution.logfiles``: 40 MiB by default).
The agent looks at that disk every :data:`CHECK_S`: while less than its reserve is free
(:func:`reserve_bytes`: 5% of the disk, at most 1 GiB), the running job whose folder holds the
most, if that is at least the reserve (:func:`culprit`: otherwise the disk was not filled by a
job, and no job is stopped for it), is killed at once (cause ``disk``), everything in its
folder but its current log is removed (no link followed), and a line in that log says why. Its
owner fails it, with that reason, and does not offer it again (it would fill the next disk too).
What a job's folder holds does not count its datasets' links (:func:`job_bytes`): those bytes are
the content store's.

The choice is sans-I/O (:func:`culprit`); :func:`folder_bytes` and :func:`clear` do the file
work, in a thread.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from agent.execution.logfiles import LOG_NAME
from agent.running.datastage import DATASETS_DIR

CHECK_S: Final = 1.0
"""How often the disk's free space is looked at (one ``statvfs``)."""
RESERVE_FRACTION: Final = 0.05
RESERVE_MAX_BYTES: Final = 1 << 30
WALK_ENTRIES_MAX: Final = 200_000
"""A folder's entries counted at most (a job that makes more is measured by these)."""


def reserve_bytes(total_bytes: int) -> int:
    """What the agent keeps free for itself on a disk of ``total_bytes``."""
    return min(RESERVE_MAX_BYTES, int(total_bytes * RESERVE_FRACTION))


def culprit(free_bytes: int, reserve: int, held: Mapping[str, int]) -> str | None:
    """The job to stop when ``free_bytes`` is below ``reserve``, of the running jobs whose
    folders hold ``held`` bytes: the one that holds the most, if it holds at least the reserve
    (else the disk was filled by something other than a job); ``None`` when there is room."""
    if free_bytes >= reserve or not held:
        return None
    job_id, most = max(held.items(), key=lambda kv: (kv[1], kv[0]))
    return job_id if most >= reserve else None


def disk_free(folder: Path) -> tuple[int, int]:
    """Bytes free (to an unprivileged user) and in all, on the disk of ``folder``."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def folder_bytes(folder: Path, limit: int = WALK_ENTRIES_MAX) -> int:
    """Bytes the files under ``folder`` take on the disk, links not followed; 0 if it is gone."""
    total, seen = 0, 0
    stack = [folder]
    while stack and seen < limit:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return total


def job_bytes(folder: Path) -> int:
    """What a job's folder holds that the job wrote: its datasets' links (``datasets/``, the
    agent's own folder of hardlinks to the content store, ``agent.running.datastage``) are the
    store's bytes, not the job's. A ``datasets`` the agent does not own (the job made it) counts."""
    total = folder_bytes(folder)
    top = folder / DATASETS_DIR
    try:
        st = os.lstat(top)
    except OSError:
        return total
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        total -= folder_bytes(top) + st.st_blocks * 512
    return max(0, total)


def clear(folder: Path) -> int:
    """Remove everything in ``folder`` but the job's current log (its rotated backups go
    too: a job printing without end fills a small disk within their bound), no link
    followed; bytes freed."""
    freed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        if entry.name == LOG_NAME:
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            freed += folder_bytes(path)
            shutil.rmtree(path, ignore_errors=True)  # follows no link inside
        else:
            try:
                freed += entry.stat(follow_symlinks=False).st_blocks * 512
                path.unlink()
            except OSError:
                continue
    return freed


def look(jobs_folder: Path, running: Iterable[str]) -> tuple[str, int, int] | None:
    """The job to stop now, with the bytes its folder holds and those free; ``None`` when
    there is room, or the disk was not filled by a job."""
    free, total = disk_free(jobs_folder)
    reserve = reserve_bytes(total)
    if free >= reserve:
        return None
    held = {job_id: job_bytes(jobs_folder / job_id) for job_id in running}
    job_id = culprit(free, reserve, held)
    return None if job_id is None else (job_id, held[job_id], free)


def note(log_path: Path, line: str) -> None:
    """Append ``line`` to the job's log (never through a link the job left in its place)."""
    flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(log_path, flags)
    except OSError:
        return
    try:
        os.write(fd, f"[shoal] {line}\n".encode())
    except OSError:
        pass
    finally:
        os.close(fd)
