"""Letting ended jobs go from an agent's disk, long after every agent retired them.

Retiring (:mod:`agent.retiring`) takes an ended job out of every agent's memory and gossip; the
owner's store, a replica's, and the runner's files kept it. Without an end of its own, an agent's
data folder grew with every job it ever owned, copied or ran: a store row each (its spec and
sealed submission), a result per attempt, and the job's folder (its log files, its checkpoint
folder, what it wrote there). An agent lets go of a job once it holds nothing newer of it than
``ended_jobs_disk_keep_s`` ago (30 days by default) and no agent's record of it is still believed
here: its rows (``Store.forget_jobs``), its folder under ``jobs/`` and any checkpoint copy it
keeps. From then on the job is unknown to this agent, as one never submitted.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Container, Sequence
from pathlib import Path

from agent.store import Store

PURGE_EVERY_S = 10.0
"""How often an agent looks for ended jobs to let go of."""
PURGE_BATCH = 500
"""Jobs let go of in one pass at most (a backlog goes in passes, the oldest first)."""


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
