"""An owner back after a restart (:class:`agent.owning.owner.Owner`'s ``resume`` and
``republish_ended``): it takes back the jobs it owned unless a newer owner published them, and
publishes again the ends of its jobs that the mesh may not have heard.

Like the owner's other parts, it depends on a protocol of what it uses of the owner
(:class:`ResumingOwner`), not on ``agent.owning.owner``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Protocol

from agent.common.eachjob import one_job
from agent.job.jobstate import TERMINAL_JOB_STATES, UNENDED_JOB_STATES
from agent.mesh.view import job_gen
from agent.owning.handover import HandoverOwner, adopt
from agent.owning.ownedjob import OwnedJob

if TYPE_CHECKING:
    from agent.storage.store import JobRecord


class ResumingOwner(HandoverOwner, Protocol):
    """What resuming uses of the owner: what taking over uses (``agent.owning.handover``), and
    publishing a job's record unchanged."""

    def _announce(self, job: OwnedJob) -> None: ...


def resume(o: ResumingOwner) -> int:
    """After a restart: take back the jobs we owned unless a newer owner published them.

    A job held already (submitted, handed over or adopted since the start) is live here: its
    stored copy must not replace it, or the copy would re-check, fence and requeue it.
    Returns how many jobs were taken back.
    """
    taken = 0
    for rec in o.store.jobs(owner=o.node_id, states=UNENDED_JOB_STATES):
        if rec.job_id in o.jobs:
            continue
        with one_job(o.job_errors, "resume", rec.job_id):
            taken += _resume_one(o, rec)
    return taken


def _resume_one(o: ResumingOwner, rec: JobRecord) -> int:
    """Take back one job stored as ours (1), unless a newer owner published it (0). A copy
    whose details do not decode is taken back from its record's columns and brought up to
    the newest record the mesh believes of it (``OwnedJob.from_record``), so that a restart
    heals it."""
    job = OwnedJob.from_record(rec)
    job.note_repaired(o.job_errors)
    doc = o.view.jobs.get(job.job_id)
    newer = doc.get("owner") if doc is not None else None
    if doc is not None and job_gen(doc) > job.gen and newer != o.node_id:
        # Someone took over while we were away: we stay a replica, of that owner, so
        # that our sweep takes the job over should it go too (the takeover brings the
        # copy up to the newest record it believes).
        if isinstance(newer, str) and newer:
            o.store.put_job(dataclasses.replace(rec, owner=newer))
        return 0
    adopt(o, job, why="resumed after restart")
    return 1 if job.job_id in o.jobs else 0


def republish_ended(o: ResumingOwner, keep_s: float, kept: int) -> int:
    """After a restart: publish again the ends of our jobs that the mesh may not have heard.

    An owner killed just after it stored a job's end may have gossiped none of it; back, it
    is live again, so nobody takes the job over, and its runner, which reported the end,
    says nothing more: the mesh would list the job as it last heard of it, for good. The
    jobs that ended within what the views keep (``keep_s``, the newest ``kept``) and whose
    stored record is newer than what this agent's view believes go out again, unchanged.
    Returns how many.
    """
    since = time.time() - keep_s
    stored = o.store.jobs(owner=o.node_id, states=TERMINAL_JOB_STATES, updated_since=since)
    ended = [rec for rec in stored if rec.job_id not in o.jobs]
    ended.sort(key=lambda rec: rec.updated_at, reverse=True)
    sent = 0
    for rec in ended[:kept]:
        with one_job(o.job_errors, "republish", rec.job_id):
            job = OwnedJob.from_record(rec)
            doc = o.view.jobs.get(job.job_id)
            if doc is not None and job_gen(doc) >= job.gen:
                continue
            o.jobs[job.job_id] = job  # as before the restart: forgotten once retired
            o._announce(job)
            sent += 1
    return sent
