"""A runner's side of a gang with real processes: holds, commits and aborts, the authority each
needs, fencing, and a hold that runs out (the clock passed in)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from agent.job.jobspec import JobSpec, Resources
from agent.running.gangdesk import GangDesk
from agent.running.runs import Declined, NotAllowed
from agent.wire.calls import GangAbort, GangCommit, GangPrepare
from agent.wire.records import GangMember
from tests.agent.authority_kit import write_ahead
from tests.agent.test_runner import GPU_TWIN, OTHER_MODEL, Rig, rig  # noqa: F401  (the fixture)

ENV = """
import json, os, sys, time
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump(dict(os.environ), f)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(30)
"""


class Clock:
    """The runner's clock (monotonic), moved on by hand."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


def prepare(on: Rig, out: Path, attempt: int = 1, ttl_s: float = 30.0) -> GangPrepare:
    """The owner's prepare of rank 1 (this runner) of a two-node gang."""
    spec = JobSpec(
        command=(sys.executable, "-c", ENV, str(out)),
        resources=Resources(gpus_per_node=1, nodes=2),
    )
    job_id = on.job_id()
    members = (GangMember(0, on.owner, ("x0",)), GangMember(1, on.runner.node_id, ("h0",)))
    sealed = on.kit.submission(job_id, spec)
    me = on.runner.node_id
    write_ahead(
        on.runner.store,
        job_id,
        spec,
        sealed,
        attempt=attempt,
        owner=on.owner,
        runner=me,
        members=members,
    )
    return GangPrepare(job_id, attempt, on.owner, members, sealed, ttl_s)


async def test_a_held_member_starts_on_commit_with_the_gang_variables(rig: Rig) -> None:  # noqa: F811
    desk, out = GangDesk(rig.runner), rig.tmp_path / "env.json"
    req = prepare(rig, out)
    answer = await desk.prepare(req, rig.owner)
    assert answer.held and answer.master_addr is None  # rank 1 names no meeting point
    assert rig.runner.free_devices() == [] and rig.runner.free_devices(but=req.job_id) == ["h0"]
    # A one-node offer of another job finds the device busy.
    with pytest.raises(Declined, match="device h0 is in use"):
        await rig.start(rig.offer())
    with pytest.raises(NotAllowed):  # only the agent that prepared it commits it
        await desk.commit(GangCommit(req.job_id, 1, "10.0.0.7", 29500), rig.member.node_id)
    started = await desk.commit(GangCommit(req.job_id, 1, "10.0.0.7", 29500), rig.owner)
    assert started.ok and rig.runner.runs[req.job_id].devices == ("h0",)
    for _ in range(300):
        if out.exists():
            break
        await asyncio.sleep(0.1)
    env = json.loads(out.read_text())
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "NODE_RANK", "NNODES")} == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "NODE_RANK": "1",
        "NNODES": "2",
    }
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.7", "29500")
    assert len(rig.runner.holds) == 0  # the hold became the run
    with pytest.raises(Declined, match="holds nothing here"):  # and is committed once
        await desk.commit(GangCommit(req.job_id, 1, "10.0.0.7", 29500), rig.owner)


async def test_an_abort_frees_the_hold_and_fences_the_attempt(rig: Rig) -> None:  # noqa: F811
    desk = GangDesk(rig.runner)
    req = prepare(rig, rig.tmp_path / "never.json", attempt=3)
    await desk.prepare(req, rig.owner)
    with pytest.raises(NotAllowed):  # a member that neither prepared it nor may own the job
        desk.abort(GangAbort(req.job_id, 3), rig.member.node_id)
    assert desk.abort(GangAbort(req.job_id, 3), rig.owner).released
    assert rig.runner.free_devices() == ["h0"]
    with pytest.raises(Declined, match="attempt 3 is fenced here"):
        await desk.prepare(req, rig.owner)
    with pytest.raises(Declined, match="holds nothing here"):
        await desk.commit(GangCommit(req.job_id, 3, "h", 1), rig.owner)
    assert not (rig.tmp_path / "never.json").exists()


async def test_a_hold_never_committed_runs_out(rig: Rig) -> None:  # noqa: F811
    clock = Clock()
    desk = GangDesk(rig.runner, clock=clock)
    req = prepare(rig, rig.tmp_path / "late.json", ttl_s=30.0)
    await desk.prepare(req, rig.owner)
    clock.now += 30.0
    with pytest.raises(Declined, match="holds nothing here"):
        await desk.commit(GangCommit(req.job_id, 1, "h", 1), rig.owner)
    assert [h.job_id for h in rig.runner.holds.expire(clock.now)] == [req.job_id]
    assert rig.runner.free_devices() == ["h0"]
    desk.close()


async def test_a_hold_longer_than_the_docs_bound_is_refused(rig: Rig) -> None:  # noqa: F811
    desk = GangDesk(rig.runner)
    for ttl_s in (30.5, 600.0):
        with pytest.raises(ValueError, match=f"at most 30 s, not {ttl_s:g} s"):
            await desk.prepare(prepare(rig, rig.tmp_path / "long.json", ttl_s=ttl_s), rig.owner)
    assert desk.holds == 0 and rig.runner.free_devices() == ["h0"]


async def test_a_prepare_needs_an_owner_and_its_operators_submission(rig: Rig) -> None:  # noqa: F811
    desk = GangDesk(rig.runner)
    req = prepare(rig, rig.tmp_path / "x.json")
    with pytest.raises(NotAllowed):
        await desk.prepare(req._replace(owner=rig.member.node_id), rig.member.node_id)
    with pytest.raises(NotAllowed):
        await desk.prepare(req._replace(submission=b"forged"), rig.owner)
    stranger = (GangMember(0, rig.owner, ("x0",)), GangMember(1, "n" * 32, ("h0",)))
    with pytest.raises(Declined, match="is not a member"):
        await desk.prepare(req._replace(members=stranger), rig.owner)
    too_many = (req.members[0], req.members[1]._replace(devices=("h0", "h1")))
    with pytest.raises(Declined, match="the member has 2 devices, the job needs 1"):
        await desk.prepare(req._replace(members=too_many), rig.owner)
    assert len(rig.runner.holds) == 0


async def test_a_prepare_whose_device_was_taken_holds_one_of_its_model_if_it_may(
    rig: Rig,  # noqa: F811
) -> None:
    """Late binding for gangs: the member's H100 was taken (gossip lagged); a prepare that lets
    the runner choose holds the other H100 and says so, and its commit starts there; never on
    another model, never without leave."""
    desk = GangDesk(rig.runner)
    rig.devices.gpus += [GPU_TWIN, OTHER_MODEL]
    first = rig.offer()
    await rig.start(first)
    assert rig.runner.runs[first["job_id"]].devices == ("h0",)
    req = prepare(rig, rig.tmp_path / "env.json")
    with pytest.raises(Declined, match="device h0 is in use"):
        await desk.prepare(req, rig.owner)
    answer = await desk.prepare(req._replace(rebind=True), rig.owner)
    assert answer.held and answer.devices == ("h1",)
    assert rig.runner.free_devices() == ["l0"]  # h0 runs the first job, h1 is held
    started = await desk.commit(GangCommit(req.job_id, 1, "10.0.0.7", 29500), rig.owner)
    assert started.ok and rig.runner.runs[req.job_id].devices == ("h1",)
    other = prepare(rig, rig.tmp_path / "other.json")
    with pytest.raises(Declined, match="device h0 is in use"):  # the L4 is no H100
        await desk.prepare(other._replace(rebind=True), rig.owner)
