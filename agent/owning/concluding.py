"""How a job's owner concludes an attempt: succeeded, retried, failed, cancelled or requeued.

:class:`agent.owning.owner.Owner` calls :func:`conclude` when the current attempt's report comes
(a gang's, from its deciding member: :mod:`agent.owning.gang`).
"""

from __future__ import annotations

import time
from typing import Protocol

from agent.job.jobstate import JobEvent, JobState
from agent.owning.elastic import Resizes, shrink_reason
from agent.owning.ownedjob import OwnedJob
from agent.owning.ownersteps import OwnerSteps
from agent.owning.preempting import host_name, stopped_reason
from agent.wire.calls import AttemptResult


class Concluding(OwnerSteps, Protocol):
    """What :func:`conclude` uses of the owner beyond its steps."""

    resizes: Resizes

    def kick(self) -> None: ...


def finished_at(r: AttemptResult) -> float:
    """When the attempt ended, as its runner says, else now."""
    return r.finished_at if r.finished_at is not None else time.time()


def conclude(o: Concluding, job: OwnedJob, runner: str, r: AttemptResult) -> None:
    """The current attempt ended with ``r`` (on ``runner``; a gang's deciding member):
    succeeded, retried, failed, cancelled or requeued."""
    job_id = job.job_id
    attempt = r.attempt
    cause = r.cause
    code = r.exit_code
    o.placement.released(runner, job.devices)
    if job.state == JobState.PLACING:
        o._move(job, JobEvent.STARTED)
    job.exit_code, job.signal = code, r.signal
    job.started_at = r.started_at if r.started_at is not None else job.started_at
    if cause == "exit" and code == 0:
        o._move(job, JobEvent.EXITED_OK)
        job.finished_at, job.reason = finished_at(r), None
        o._save(job)
        o.events.add("succeeded", f"on {runner[:8]}, attempt {attempt}", job_id=job_id)
    elif cause == "disk":  # never offered again: it would fill the next node's disk too
        o._move(job, JobEvent.EXITED_ERROR)
        host = host_name(o.view, runner)
        job.finished_at = finished_at(r)
        job.reason = f"stopped: its folder filled the disk of {host} (its files there removed)"
        o._save(job)
        o.events.add("failed", job.reason, job_id=job_id)
    elif cause in ("exit", "timeout"):
        why = "timed out" if cause == "timeout" else f"exited with {code or job.signal}"
        job.failures += 1
        if job.failures <= job.spec.retries:
            o._move(job, JobEvent.RETRY)
            job.runner, job.devices = None, ()
            job.reason = f"attempt {attempt} {why}; retrying"
            o._save(job)
            o.events.add("retrying", job.reason, job_id=job_id)
            o.kick()
        else:
            o._move(job, JobEvent.EXITED_ERROR)
            job.finished_at, job.reason = finished_at(r), why
            o._save(job)
            o.events.add("failed", f"{why} on {runner[:8]}", job_id=job_id)
    elif cause == "cancel":
        o._move(job, JobEvent.CANCEL)
        job.finished_at = finished_at(r)
        o._save(job)
    else:
        moved = cause == "migrate" and r.preempted_by is not None  # for a team's guarantee
        if cause in ("drain", "shutdown") or moved:
            # The report can beat the gossip that says so: do not offer it straight back. A job
            # moved off for a team's guarantee: its node is kept for that team's job.
            job.avoid = runner
        if cause == "shrink":
            o.resizes.stopping(job_id, len(job.devices), shrink_reason(r.preempted_by))
        elif moved:
            o.events.add(
                "moved",
                f"off {host_name(o.view, runner)} for {r.preempted_by}",
                job_id=job_id,
            )
        elif r.preempted_by:
            o.events.add(
                "preempted",
                f"by {r.preempted_by} on {host_name(o.view, runner)}",
                job_id=job_id,
            )
        o._requeue(job, stopped_reason(r, runner, o.view))
