"""Retiring ended jobs: what every agent forgets of a job long after it ended.

Every agent holds every job's gossiped records (its submission and its status: ~11 KB of memory
each with the parsed spec), and every push-pull names them: without an end, an agent's memory and
its digests grew with every job the mesh ever ran (~16 KB of resident memory per job, measured on a
demo mesh at 8 jobs/s). Each agent retires an ended job on its own, by the same rule over the same
records: once it ended more than ``keep_s`` ago by its record's ``finished_at`` (the owner's clock;
its submission time if it has none), or as soon as ``kept`` jobs ended after it. Retiring drops the
job from the view and both its records from the gossip store, which refuses the copies a lagging
member still gossips (:mod:`gossip.records`), and the owner forgets its copy in memory. The owner's
store keeps the job on disk: ``GET /v1/jobs/<id>`` on its owner (or on an agent that held a
replica) still answers. A runner keeps its fence (the last attempt it ran of each job: a few dozen
bytes), so an offer for an old attempt is refused however late it comes, until the job leaves
its disk too (:mod:`agent.storage.purging`, 30 days by default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.job.jobstate import TERMINAL_JOB_STATES

RETIRE_EVERY_S = 10.0
"""How often an agent looks for ended jobs to retire."""


def due(jobs: Mapping[str, Mapping[str, Any]], now: float, keep_s: float, kept: int) -> list[str]:
    """The ended jobs of ``jobs`` (believed records by id) to retire at ``now``."""
    ended = sorted(
        (
            (float(finished_at), job_id)
            for job_id, doc in jobs.items()
            if doc.get("state") in TERMINAL_JOB_STATES
            and isinstance(finished_at := _ended_at(doc), int | float)
        ),
        reverse=True,  # the newest first: those are kept
    )
    return [
        job_id
        for i, (finished_at, job_id) in enumerate(ended)
        if i >= kept or now - finished_at > keep_s
    ]


def _ended_at(doc: Mapping[str, Any]) -> object:
    return doc.get("finished_at") or doc.get("submitted_at")
