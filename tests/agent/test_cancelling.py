"""A cancel's answer and its stops, on the owner's real store with runners on loopback (the
fixture of ``tests/agent/test_owner.py``); on real agents, see
``tests/agent/test_attacks_owners.py``."""

from __future__ import annotations

import pytest

from agent.job.jobspec import new_job_id
from agent.job.jobstate import JobState
from agent.owning.ownedjob import OwnedJob
from agent.owning.owner import Owner
from tests.agent.test_owner import Fixture, _settled, fx

__all__ = ["fx"]


async def _running(fx: Fixture) -> tuple[Owner, OwnedJob]:
    owner = fx.owner()
    job_id = new_job_id()
    await owner.submit(fx.submission(job_id))
    await _settled(owner)
    job = owner.jobs[job_id]
    assert job.state == JobState.RUNNING and job.runner == "runner-b"
    return owner, job


def _stops(fx: Fixture, job_id: str) -> list[str]:
    return [node for op, node, body in fx.calls if op == "stop" and body["job_id"] == job_id]


async def test_a_cancel_answers_once_the_runner_confirmed_the_stop(fx: Fixture) -> None:
    owner, job = await _running(fx)
    assert await owner.cancel(job.job_id) == {"job_id": job.job_id, "state": "cancelled"}
    assert _stops(fx, job.job_id) == ["runner-b"]  # asked, and answered, before the answer
    await owner.close()


async def test_a_cancel_whose_save_failed_still_stops_the_job_and_says_so_after(
    fx: Fixture,
) -> None:
    owner, job = await _running(fx)
    job.signal = "S" * 5000  # its record no longer fits: the cancel's save fails
    with pytest.raises(ValueError, match="over one record's limit"):
        await owner.cancel(job.job_id)
    await _settled(owner)
    assert _stops(fx, job.job_id) == ["runner-b"]  # the stop went out all the same
    assert job.state == JobState.CANCELLED
    assert await owner.cancel(job.job_id) == {"job_id": job.job_id, "state": "cancelled"}
    await owner.close()
