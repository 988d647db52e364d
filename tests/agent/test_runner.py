"""The runner's admission with real processes: fencing during a launch, declining on shutdown, and
the authority an offer or a stop needs."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.checkpoints.ckptstore import Checkpoints
from agent.content.fetch import Fetcher
from agent.content.store import DiskStore
from agent.execution.executor import ProcessExecutor
from agent.execution.launch import ExecutorConfig
from agent.job.authority import SubmissionRefused
from agent.job.jobspec import JobSpec, Resources, new_job_id
from agent.job.ownership import rank
from agent.mesh.context import AgentContext
from agent.mesh.events import EventLog
from agent.mesh.peers import PeerClient
from agent.mesh.view import ClusterView
from agent.owning.placement import ShoalPlacement
from agent.running.confirming import NotConfirmed, Unconfirmed
from agent.running.runner import Runner
from agent.running.runs import Declined, LaunchFailed, NotAllowed
from agent.storage.store import Store
from agent.wire.calls import AttemptResult, StartOffer, StopAnswer, StopRequest
from gossip.certtrust import CertSigner
from gossip.identity import NodeIdentity
from probers.records import DeviceStatic
from tests.agent.authority_kit import FakeMesh, Kit, write_ahead

GPU = DeviceStatic(key="h0", vendor="nvidia", backend="cuda", name="H100", source="sim")
GPU_TWIN = dataclasses.replace(GPU, key="h1")
OTHER_MODEL = DeviceStatic(key="l0", vendor="nvidia", backend="cuda", name="L4", source="sim")


@dataclass
class FakeDevices:
    """This node's devices: fixed, and no load to show."""

    gpus: list[DeviceStatic]

    def statics(self) -> list[DeviceStatic]:
        return self.gpus

    def set_load(self, key: str, jobs: Sequence[int]) -> None:
        pass


@dataclass
class Rig:
    """A runner on this node; the agent that owns the jobs offered to it; another member of the
    mesh (a valid, admitted agent certificate), last in the order of every job offered here."""

    kit: Kit
    runner: Runner
    owner: str
    member: NodeIdentity
    tmp_path: Path
    devices: FakeDevices

    def job_id(self) -> str:
        """A job whose order puts the member last of the three live agents."""
        while True:
            job_id = new_job_id()
            if rank(job_id, [self.runner.node_id, self.owner, self.member.node_id])[2] == (
                self.member.node_id
            ):
                return job_id

    def offer(self, attempt: int = 1, command: tuple[str, ...] | None = None) -> dict[str, Any]:
        pidfile = self.tmp_path / f"pid-{attempt}"
        write_pid = f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))"
        script = f"import os, time; {write_pid}; time.sleep(60)"
        spec = JobSpec(
            command=command or (sys.executable, "-c", script),
            resources=Resources(gpus_per_node=1),
        )
        job_id = self.job_id()
        sealed = self.kit.submission(job_id, spec)
        return {
            "job_id": job_id,
            "attempt": attempt,
            "devices": ["h0"],
            "owner": self.owner,
            "submission": base64.b64encode(sealed).decode("ascii"),
        }

    def write_ahead(self, offer: dict[str, Any]) -> None:
        """The owner's copy of the offered attempt, written ahead to the job's other owner: this
        runner (the member is last in the order of every job offered here)."""
        sealed = base64.b64decode(offer["submission"])
        try:
            spec = self.runner.authority.submission(sealed, offer["job_id"]).spec
        except SubmissionRefused:
            return  # no owner holds a job of a submission no operator made
        me, attempt = self.runner.node_id, offer["attempt"]
        write_ahead(
            self.runner.store,
            offer["job_id"],
            spec,
            sealed,
            attempt=attempt,
            owner=self.owner,
            runner=me,
        )

    async def start(self, offer: dict[str, Any]) -> dict[str, Any]:
        """Offer the attempt as its owner does: written ahead, then offered."""
        self.write_ahead(offer)
        return (await self.runner.start(StartOffer.from_wire(offer), self.owner)).to_wire()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    kit = Kit(tmp_path)
    me, owner, member = kit.agent("me"), kit.agent("owner"), kit.agent("member")
    live = [me.node_id, owner.node_id, member.node_id]
    store = Store(tmp_path / "agent.sqlite")
    store.set_node_id(me.node_id)
    peers = PeerClient(me)
    authority = kit.authority(me.node_id, lambda: live, owner, member)
    r: Runner | None = None
    executor = ProcessExecutor(
        ExecutorConfig(data_dir=tmp_path, grace_s=1.0),
        on_event=lambda e: r.on_exec_event(e) if r is not None else None,
    )
    ctx = AgentContext(
        node_id=me.node_id,
        store=store,
        view=ClusterView(authority),
        peers=peers,
        events=EventLog(me.node_id),
        authority=authority,
        mesh=FakeMesh(lambda: live, lambda node: None),  # reports wait: no owner to take them
        publish=lambda kind, payload: None,
        changed=lambda: None,
        stop_grace_s=1.0,
    )
    devices = FakeDevices([GPU])
    r = Runner(ctx, executor, devices, rebind=ShoalPlacement(owner=me.node_id).rebind)
    try:
        yield Rig(kit, r, owner.node_id, member, tmp_path, devices)
    finally:
        await executor.close()
        await r.close()
        await peers.close()
        store.close()


async def test_a_stop_that_lands_while_the_job_launches_ends_it(rig: Rig) -> None:
    # The owner's offer timed out, so it fences the attempt while the runner is still launching.
    runner, tmp_path = rig.runner, rig.tmp_path
    offer = rig.offer()
    start = asyncio.create_task(rig.start(offer))
    await asyncio.sleep(0)  # the launch is under way: the process is being spawned
    assert offer["job_id"] in runner.runs and not runner.executor.running()
    answer = await runner.stop(StopRequest(offer["job_id"], 1, "fenced"), rig.owner)
    assert answer == StopAnswer(stopped=False)
    with pytest.raises(Declined, match="stopped as it started"):
        await start
    # The owner took "not running" for an answer: nothing of that attempt may run on.
    assert offer["job_id"] not in runner.runs
    assert runner.executor.running() == ()
    pid = int((tmp_path / "pid-1").read_text()) if (tmp_path / "pid-1").exists() else None
    if pid is not None:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_offers_are_declined_once_the_agent_shuts_down(rig: Rig) -> None:
    runner = rig.runner
    running = rig.offer()
    await rig.start(running)
    assert running["job_id"] in runner.runs
    await runner.shutdown(wait_reports_s=0)
    assert runner.runs == {}
    with pytest.raises(Declined, match="shutting down"):
        await rig.start(rig.offer(attempt=2))


async def test_an_offer_whose_device_was_taken_starts_on_one_of_its_model_if_it_may(
    rig: Rig,
) -> None:
    """Late binding: two owners offered h0 from gossip that lagged; the second offer, when it
    lets the runner choose, starts on the other H100 and says so; never on another model."""
    runner = rig.runner
    rig.devices.gpus += [GPU_TWIN, OTHER_MODEL]
    first = rig.offer()
    assert "devices" not in await rig.start(first)
    assert runner.runs[first["job_id"]].devices == ("h0",)
    with pytest.raises(Declined, match="device h0 is in use"):
        await rig.start(rig.offer())  # an owner that did not let the runner choose
    second = dict(rig.offer(), rebind=True)
    answer = await rig.start(second)
    assert answer["devices"] == ["h1"]
    assert runner.runs[second["job_id"]].devices == ("h1",)
    assert sorted(runner.held()) == ["h0", "h1"]
    with pytest.raises(Declined, match="device h0 is in use"):
        await rig.start(dict(rig.offer(), rebind=True))  # both H100 taken; the L4 is no H100
    assert sorted(runner.held()) == ["h0", "h1"]


async def test_an_offer_runs_only_the_operators_submission_from_an_owner(rig: Rig) -> None:
    runner, member = rig.runner, rig.member
    # Another member of the mesh: a valid agent certificate, but no owner of these jobs.
    offer = rig.offer()
    with pytest.raises(NotAllowed, match="may not start"):
        await runner.start(StartOffer.from_wire(dict(offer, owner=member.node_id)), member.node_id)
    with pytest.raises(NotAllowed, match="may not start"):
        await runner.start(
            StartOffer.from_wire(offer), member.node_id
        )  # claiming to be the owner is not enough
    # The owner itself, with a submission an agent signed instead of an operator.
    forged = rig.offer()
    spec = JobSpec(command=("sh", "-c", "cat /etc/shadow"))
    sealed = rig.kit.submission(forged["job_id"], spec, signer=CertSigner(member))
    forged["submission"] = base64.b64encode(sealed).decode("ascii")
    with pytest.raises(NotAllowed, match="not_operator"):
        await rig.start(forged)
    # A genuine submission, of another job.
    other = rig.offer()
    with pytest.raises(NotAllowed, match="is of job"):
        await rig.start(dict(other, job_id=offer["job_id"]))
    assert runner.runs == {} and runner.executor.running() == ()
    await rig.start(offer)
    assert list(runner.runs) == [offer["job_id"]]


async def test_an_offer_starts_only_once_the_jobs_other_owner_confirms_it(rig: Rig) -> None:
    runner = rig.runner
    # This runner is the job's other owner: it starts what its copy (the write-ahead) places
    # here, and nothing else, whoever offers it.
    offer = rig.offer(attempt=2)
    write_ahead(runner.store, offer["job_id"], JobSpec(command=("true",)), b"", attempt=1,
                owner=rig.owner, runner=runner.node_id)  # fmt: skip
    with pytest.raises(NotConfirmed, match="its copy is at attempt 1"):
        await runner.start(StartOffer.from_wire(offer), rig.owner)
    # A job whose order puts the member beside the owner: the member must confirm, and this
    # runner knows no address of it yet.
    live = [runner.node_id, rig.owner, rig.member.node_id]
    job_id = next(j for j in iter(new_job_id, "") if rank(j, live)[2] == runner.node_id)
    sealed = rig.kit.submission(job_id, JobSpec(command=("true",)))
    offer = dict(offer, job_id=job_id, submission=base64.b64encode(sealed).decode("ascii"))
    with pytest.raises(Unconfirmed, match="has no address here yet"):
        await runner.start(StartOffer.from_wire(offer), rig.owner)
    assert runner.runs == {} and runner.executor.running() == ()
    assert runner.confirmer.counts == {"refused": 1, "denied": 1, "unanswered": 1}


async def test_only_an_owner_or_the_starter_may_stop_a_job(rig: Rig) -> None:
    runner, member = rig.runner, rig.member
    offer = rig.offer()
    await rig.start(offer)
    stop = StopRequest(offer["job_id"], 1, "cancel", 0.0)
    with pytest.raises(NotAllowed, match="may not stop"):
        await runner.stop(stop, member.node_id)
    # Nor may it fence attempts to come of a job it has no part in.
    with pytest.raises(NotAllowed):
        await runner.stop(StopRequest(rig.job_id(), 10**9, "cancel", 0.0), member.node_id)
    assert list(runner.runs) == [offer["job_id"]] and len(runner.fence) == 1
    assert runner.fence.get(offer["job_id"]) == 1
    answer = await runner.stop(stop, rig.owner)
    assert answer.stopped is True


async def test_a_launch_error_is_its_own_refusal(rig: Rig) -> None:
    with pytest.raises(LaunchFailed, match="no-such-program"):
        await rig.start(rig.offer(command=("no-such-program-here",)))
    assert rig.runner.runs == {}


async def test_an_offer_of_a_job_that_needs_a_feature_this_agent_lacks_is_declined(
    rig: Rig,
) -> None:
    offer = rig.offer()
    boxed = JobSpec(command=("true",), image="docker.io/library/python:3.12")
    offer["submission"] = base64.b64encode(rig.kit.submission(offer["job_id"], boxed)).decode()
    # This agent found no container runtime: an image is a feature its node does not run.
    with pytest.raises(Declined, match="needs a Linux host with a container runtime"):
        await rig.start(offer)
    assert rig.runner.runs == {} and rig.runner.executor.running() == ()


async def test_a_gang_is_not_started_by_a_one_node_offer(rig: Rig) -> None:
    offer = rig.offer()
    gang = JobSpec(command=("true",), resources=Resources(gpus_per_node=1, nodes=2))
    offer["submission"] = base64.b64encode(rig.kit.submission(offer["job_id"], gang)).decode()
    with pytest.raises(Declined, match="a gang starts through gang_prepare and gang_commit"):
        await rig.start(offer)
    assert rig.runner.runs == {} and rig.runner.executor.running() == ()


async def test_a_report_the_owner_has_moved_past_is_dropped(rig: Rig) -> None:
    """After a restart, an attempt lost in it is reported to an owner the view may not know
    yet; once gossip shows the job past that attempt, the report has no one to tell."""
    runner, job_id = rig.runner, new_job_id()
    record = {"job_id": job_id, "state": "running", "attempt": 1, "owner": rig.owner}
    runner.view.jobs[job_id] = record
    lost = AttemptResult(job_id, 1, None, None, "lost", 1.0, 2.0)
    runner.queue_report(lost, None)
    await asyncio.sleep(0.5)  # no owner address in this rig: the report waits, retrying
    assert (job_id, 1) in runner.reports.pending
    runner.view.jobs[job_id] = {**record, "attempt": 2, "runner": rig.member.node_id}
    async with asyncio.timeout(10):
        while (job_id, 1) in runner.reports.pending:
            await asyncio.sleep(0.05)


def checkpoints_of(rig: Rig) -> Checkpoints:
    """The runner's checkpoints, in a content store of its own."""
    store = DiskStore(rig.tmp_path / "store")
    ctx = rig.runner.ctx
    checkpoints = Checkpoints(
        ctx, store, Fetcher(store), rig.runner, os.geteuid(), Counter(), rig.tmp_path
    )
    rig.runner.checkpoints = checkpoints
    return checkpoints


async def test_an_attempt_starts_from_the_checkpoint_its_offer_names_or_from_nothing(
    rig: Rig,
) -> None:
    runner, tmp_path = rig.runner, rig.tmp_path
    checkpoints = checkpoints_of(rig)
    out = tmp_path / "seen"
    look = (
        "import json, os; d = os.environ['SHOAL_CHECKPOINT_DIR']; "
        "seen = [sorted(os.listdir(d)), os.environ.get('SHOAL_RESUME')]; "
        f"json.dump(seen, open({str(out)!r}, 'w'))"
    )

    async def run(offer: dict[str, Any]) -> list[Any]:
        await rig.start(offer)
        await runner.executor.wait(offer["job_id"])
        seen: list[Any] = json.loads(out.read_text())
        return seen

    # What an earlier attempt left on this node is cleared, never resumed.
    offer = rig.offer(attempt=3, command=(sys.executable, "-c", look))
    job_id = offer["job_id"]
    folder = runner.checkpoint_folder(job_id)
    folder.mkdir(parents=True)
    (folder / "step").write_text("1")
    assert await run(offer) == [[], None]
    # A checkpoint this node's store holds (attempt 3's folder, read in) is put in the folder,
    # with SHOAL_RESUME=1.
    data = b"step 40"
    (folder / "step").write_bytes(data)
    ref = await checkpoints.read_folder(job_id, 3)
    assert ref is not None and checkpoints.held(job_id) == ref
    offer = {**offer, "attempt": 5, "resume": {"attempt": 3, "digest": ref.digest}}
    assert await run(offer) == [["step"], "1"]
    assert (folder / "step").read_bytes() == data
    # A checkpoint it does not hold, and no holder to fetch it from: the offer is declined,
    # not started afresh.
    offer = {**offer, "attempt": 6, "resume": {"attempt": 5, "digest": "0" * 64}}
    with pytest.raises(Declined, match="checkpoint"):
        await rig.start(offer)
    assert job_id not in runner.runs


async def test_pulling_from_itself_a_checkpoint_of_an_attempt_not_run_here_last_is_refused(
    rig: Rig,
) -> None:
    """Found by ``bench.chaos`` (42 ERROR lines with tracebacks in one run of seed 3): after a
    healed partition an owner held the job at attempt 2, run here, while the other side's owner
    had run attempt 3 here since; before each new attempt it pulled attempt 2's checkpoint from
    itself, and the local folder's refusal was raised out of the placement instead of taken as
    a refusal (as a remote folder's is), again at every round. It is a refusal now: nothing
    pulled, nothing raised."""
    runner = rig.runner
    checkpoints = checkpoints_of(rig)
    offer = rig.offer(attempt=3, command=(sys.executable, "-c", "pass"))
    await rig.start(offer)
    await runner.executor.wait(offer["job_id"])
    (runner.checkpoint_folder(offer["job_id"]) / "step").write_text("3")
    assert await checkpoints.pull(offer["job_id"], runner.ctx.node_id, 2) is None
    assert checkpoints.counts["failed"] == 1
    assert checkpoints.held(offer["job_id"]) is None


async def test_a_run_that_ended_leaves_no_progress_and_a_purged_job_no_fence(rig: Rig) -> None:
    """The runner's progress of a job went on for every job it ever ran (its node record names
    the running ones only); its fence goes when the job leaves the disk
    (``agent.storage.purging``)."""
    gate = rig.tmp_path / "gate"
    script = (
        "import os, time; print('SHOAL_PROGRESS 0.5', flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)"
    )
    offer = rig.offer(command=(sys.executable, "-c", script))
    job_id = offer["job_id"]
    await rig.start(offer)
    assert job_id in rig.runner.runs
    for _ in range(400):
        if job_id in rig.runner.progress:
            break
        await asyncio.sleep(0.05)
    assert rig.runner.progress[job_id][0] == 0.5
    gate.touch()
    for _ in range(400):
        if job_id not in rig.runner.runs:
            break
        await asyncio.sleep(0.05)
    assert job_id not in rig.runner.runs and job_id not in rig.runner.progress
    assert rig.runner.fence.get(job_id) == 1
    rig.runner.forget_fences([job_id])
    assert len(rig.runner.fence) == 0
    assert rig.runner.fence.get(job_id) == 1  # its store says attempt 1 ran here
    with pytest.raises(Declined, match="attempt 1 is fenced here"):
        await rig.start(offer)
    rig.runner.store.forget_jobs([job_id])  # the job left the disk
    assert rig.runner.fence.get(job_id) == 0
