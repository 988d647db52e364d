"""Letting ended jobs go from an agent's disk, long after every agent retired them.

Retiring (:mod:`agent.mesh.retiring`) takes an ended job out of every agent's memory and gossip; the
owner's store, a replica's, and the runner's files kept it. Without an end of its own, an agent's
data folder grew with every job it ever owned, copied or ran: a store row each (its spec and
sealed submission), a result per attempt, and the job's folder (its log files, its checkpoint
folder, what it wrote there). An agent lets go of a job once it holds nothing newer of it than
``ended_jobs_disk_keep_s`` ago (30 days by default) and no agent's record of it is still believed
here: its rows (``Store.forget_jobs``), its folder under ``jobs/`` and any checkpoint copy it
keeps. From then on the job is unknown to this agent, as one never submitted.

A job's folder can outlive every row of it: a launch that failed after the folder was made
records no result. So, as often as the keep (at most hourly, at least every ``PURGE_EVERY_S``),
an agent also lets go of each folder under ``jobs/`` named for a job, unchanged for as long,
that its store holds nothing of (``stray_folders``).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Container, Sequence
from pathlib import Path

from agent.job.jobspec import check_job_id
from agent.storage.store import Store

PURGE_EVERY_S = 10.0
"""How often an agent looks for ended jobs to let go of."""
PURGE_BATCH = 500
"""Jobs let go of in one pass at most (a backlog goes in passes, the oldest first)."""
STRAYS_EVERY_S = 3600.0
"""How often, at most, an agent reads its ``jobs/`` folder for folders no row names."""


def strays_every_s(keep_s: float) -> float:
    """How often to look for stray folders, for a keep of ``keep_s``."""
    return min(STRAYS_EVERY_S, max(PURGE_EVERY_S, keep_s))


def due(store: Store, listed: Container[str], now: float, keep_s: float) -> list[str]:
    """The jobs to let go of at ``now`` (wall time): held nothing newer of than ``keep_s`` ago,
    and not among the jobs this agent still lists (``listed``: its view's, by id)."""
    return [j for j in store.ended_before(now - keep_s, PURGE_BATCH) if j not in listed]


def remove_folders(job_ids: Sequence[str], folders: Sequence[Callable[[str], Path]]) -> None:
    """Remove each job's folders (``folders``: where each kind of folder of a job is). Blocking:
    run it in a thread. ``shutil.rmtree`` follows no link a job left inside, and refuses a
    folder that was swapped for a link."""
    for job_id in job_ids:
        for folder in folders:
            shutil.rmtree(folder(job_id), ignore_errors=True)


def old_folders(jobs_dir: Path, before: float, limit: int = PURGE_BATCH) -> list[str]:
    """Up to ``limit`` jobs whose folder under ``jobs_dir`` (a real folder named for a job, not
    a link) was last changed before ``before`` (wall time). Blocking: run it in a thread."""
    found: list[str] = []
    try:
        entries = os.scandir(jobs_dir)
    except OSError:
        return found
    with entries:
        for entry in entries:
            try:
                check_job_id(entry.name)
                st = entry.stat(follow_symlinks=False)
            except (ValueError, OSError):
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_mtime < before:
                found.append(entry.name)
                if len(found) >= limit:
                    break
    return found


def stray_folders(
    store: Store, candidates: Sequence[str], listed: Container[str], running: Container[str]
) -> list[str]:
    """Of the jobs whose folder is old (:func:`old_folders`), those nothing else names: no row
    in the store, not listed, not running here."""
    held = store.held(candidates)
    return [j for j in candidates if j not in held and j not in listed and j not in running]
