"""An owner's step on a job stays in its memory only if the store keeps it: a full disk undoes it,
so the runner that reported the attempt's end (answered 507) reports again and the step runs
again, instead of the owner holding, unsaved and unsaid, a job it believes already ended."""

from __future__ import annotations

import pytest

from agent.job.jobspec import JobSpec, new_job_id
from agent.job.jobstate import JobState
from agent.owning.ownedjob import OwnedJob, kept_or_undone
from agent.storage.store import StoreFull
from agent.wire.records import AttemptEntry


def _running() -> OwnedJob:
    job = OwnedJob(new_job_id(), JobSpec(command=("true",)), JobState.RUNNING, 1, "me", "r1", 0.0)
    job.attempts.append(AttemptEntry(1, "r1", 1.0, None, None, None))
    return job


def test_a_step_the_store_refuses_is_undone_in_memory() -> None:
    job = _running()
    with pytest.raises(StoreFull), kept_or_undone(job):
        job.attempt_ended(1, "disk", None, 2.0)
        job.state, job.reason, job.gen = JobState.FAILED, "stopped", job.gen + 1
        raise StoreFull("cannot write to agent.sqlite: database or disk is full")
    assert (job.state, job.reason, job.gen) == (JobState.RUNNING, None, 0)
    assert job.attempts == [AttemptEntry(1, "r1", 1.0, None, None, None)]


def test_a_step_the_store_keeps_stays() -> None:
    job = _running()
    with kept_or_undone(job):
        job.attempt_ended(1, "disk", None, 2.0)
        job.state = JobState.FAILED
    assert job.state == JobState.FAILED and job.attempts[0].cause == "disk"
