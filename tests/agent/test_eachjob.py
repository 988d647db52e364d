"""One job's failure stops no loop over many, and a restart heals a job whose stored copy is bad:
the owner's loops, on its real store, with runners on loopback (the fixture of
``tests/agent/test_owner.py``).

The failing job is one whose record no longer fits one gossip record (a signal name of 5,000
characters: ``gossip_payload`` refuses it), so every save of it raises where it is published.
"""

from __future__ import annotations

import dataclasses

from agent.job.jobspec import JobSpec, Resources, new_job_id
from agent.job.jobstate import JobState
from agent.owning.owner import Owner
from tests.agent.test_owner import Fixture, _settled, fx

__all__ = ["fx"]

CPU_ONLY = JobSpec(command=("true",), resources=Resources(gpus_per_node=0))


async def _three_running(fx: Fixture) -> tuple[Owner, list[str]]:
    owner = fx.owner()
    job_ids = [new_job_id() for _ in range(3)]
    for job_id in job_ids:
        await owner.submit(fx.submission(job_id, CPU_ONLY))
        await _settled(owner)
    assert all(owner.jobs[j].state == JobState.RUNNING for j in job_ids)
    assert {owner.jobs[j].runner for j in job_ids} == {"runner-b"}
    return owner, job_ids


async def test_the_member_gone_sweep_goes_on_past_a_job_that_fails(fx: Fixture) -> None:
    owner, (broken, *others) = await _three_running(fx)
    owner.jobs[broken].signal = "S" * 5000  # its record can no longer be published
    owner.member_gone("runner-b")  # the runner died: each job of it is requeued
    for job_id in others:
        assert owner.jobs[job_id].state == JobState.PENDING, job_id
        assert "runner-b is gone" in (owner.jobs[job_id].reason or "")
    assert owner.job_errors == {"member_gone": 1}
    await owner.close()


async def test_a_resume_goes_on_past_a_job_that_fails(fx: Fixture) -> None:
    fx.runners.clear()  # nothing fits: the jobs wait
    before = fx.owner()
    job_ids = [new_job_id() for _ in range(3)]
    for job_id in job_ids:
        await before.submit(fx.submission(job_id))
    await before.close()
    after = fx.owner()
    # The first job's stored record holds a signal no record can carry: its resume fails.
    rec = fx.store.get_job(job_ids[0])
    assert rec is not None
    fx.store.put_job(dataclasses.replace(rec, detail={**rec.detail, "signal": "S" * 5000}))
    assert after.resume() == 2
    for job_id in job_ids[1:]:
        assert after.jobs[job_id].state == JobState.PENDING
    assert after.job_errors == {"resume": 1}
    await after.close()


async def test_a_restart_takes_back_a_job_whose_stored_gen_is_past_any_counter(
    fx: Fixture,
) -> None:
    """A copy kept before integers on the wire were bounded: ``gen = 2**64 - 1``. The owner,
    restarted, takes it back from its record at the gen the mesh believes, and counts it."""
    fx.runners.clear()  # nothing fits: the job waits
    heard: list[tuple[str, bytes]] = []
    before = fx.owner(publish=lambda kind, payload: heard.append((kind, payload)))
    job_id = new_job_id()
    await before.submit(fx.submission(job_id))
    await before.close()
    for kind, payload in heard:  # the mesh heard of it
        fx.view.apply(fx.me, kind, payload, 0.0)
    believed = fx.view.jobs[job_id]["gen"]
    rec = fx.store.get_job(job_id)
    assert rec is not None
    fx.store.put_job(dataclasses.replace(rec, detail={**rec.detail, "gen": 2**64 - 1}))
    heard.clear()
    after = fx.owner(publish=lambda kind, payload: heard.append((kind, payload)))
    assert after.resume() == 1
    job = after.jobs[job_id]
    assert job.state == JobState.PENDING and job.gen == believed + 1
    assert after.job_errors == {"stored_copy_repaired": 1}
    for kind, payload in heard:  # what it publishes now is believed again
        fx.view.apply(fx.me, kind, payload, 0.0)
    assert fx.view.jobs[job_id]["gen"] == believed + 1
    assert await after.cancel(job_id) == {"job_id": job_id, "state": "cancelled"}
    await after.close()
