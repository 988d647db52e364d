"""The owner side of the job protocol: accept, replicate, place, follow and recover owned jobs.

One agent owns each job (``agent.job.ownership``). The owner:

- persists a submission (SQLite, ``synchronous=FULL``) and copies it to the replica before it
  answers, so an acknowledged job survives the loss of one host;
- places pending jobs: candidates from ``Placement``, offered in turn; each offer is a new attempt,
  written to the replica *before* the offer goes out, so whoever takes over knows which attempt
  may be running where;
- treats an offer that got no answer as "maybe running": it fences that attempt on the runner (a
  stop that also forbids a late start) and only then moves on;
- requeues a job only when its runner is declared dead by gossip or has confirmed the stop, so two
  attempts never run at once;
- publishes ``job/<id>`` records (a ``gen`` counter orders versions across successive owners);
- when no node has room for a pending job, offers it naming the running jobs the policy would
  preempt for it (``agent.owning.preempting``; the runner checks them:
  ``agent.running.preemption``), and requeues a job of its own that was preempted, saying by whom.

This module holds :class:`Owner`: the commands (submit, cancel, migrate, and growing an elastic
job: ``agent.owning.elastic``), publishing and replicating a job, the placement loop (which also
says the deadlines jobs miss: ``agent.job.deadlines``), stopping an attempt on its runner, and the
runners' reports with how an attempt's end concludes the job. Its parts depend on a protocol of
what they use of it (``agent.owning.ownersteps``), not on this module:

- ``agent.owning.placing``: placing one job on one node (candidates, the write-ahead, offers in
  turn);
- ``agent.owning.collecting``: the jobs' checkpoints, pulled from their runners and named in
  each offer (content of the store, ``agent.checkpoints.ckptstore``), so an attempt resumes from
  the newest copy the owner holds;
- ``agent.owning.handover``: when an owner is gone, the next agent in the job's rendezvous order
  takes over from the copy it holds (or is handed the copy by the agent that holds it) and asks the
  runner where things stand; a job is handed to the agent first in its order;
- ``agent.owning.resuming``: after a restart, the jobs it owned taken back and the ends the mesh
  may not have heard published again;
- ``agent.owning.gang``: a gang (a job on several nodes) placed, followed and ended as a whole; the
  hooks here hand it the gang's placement, its members' reports and deaths.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from agent.common.eachjob import one_job
from agent.job.authority import Submission
from agent.job.deadlines import missed_line, newly_missed
from agent.job.jobstate import (
    LIVE,
    IllegalTransition,
    JobEvent,
    JobState,
    is_terminal,
    transition,
)
from agent.job.ownership import rank
from agent.mesh.context import AgentContext
from agent.mesh.peers import PeerError, decoded_answer
from agent.mesh.view import JOB_PREFIX, SUB_PREFIX
from agent.owning import handover, resuming
from agent.owning.cancelling import Cancels
from agent.owning.collecting import Collector
from agent.owning.concluding import conclude, finished_at
from agent.owning.elastic import Grow, Growth, Resizes
from agent.owning.gang import Gangs
from agent.owning.handover import HANDOVER_SETTLE_S as HANDOVER_SETTLE_S
from agent.owning.handover import UNHEARD_OWNER_GRACE_S as UNHEARD_OWNER_GRACE_S
from agent.owning.meshqueue import MeshQueues
from agent.owning.ownedjob import OwnedJob, OwnerError, gossip_payload, job_wire, kept_or_undone
from agent.owning.placement import Candidate, Placement
from agent.owning.placing import LAUNCH_FAILED as LAUNCH_FAILED
from agent.owning.placing import MAX_LAUNCH_FAILURES as MAX_LAUNCH_FAILURES
from agent.owning.placing import RESTORE_TIMEOUT_S as RESTORE_TIMEOUT_S
from agent.owning.placing import candidates_for, place_once, reserve
from agent.owning.prefetching import Prefetcher
from agent.storage.store import StoreFull
from agent.wire.calls import AttemptResult, StopAnswer, StopRequest
from agent.wire.ckptcalls import CheckpointNote

STOP_TRIES = 120
"""How many times (a second apart, after a failure) an owner asks a runner to stop an attempt."""
UNLISTED_CHECK_S = 15.0
"""How long a running job's runner may publish node records that do not list it before its
owner asks the runner where the attempt stands (gossip brings a start within a few seconds)."""

if TYPE_CHECKING:
    from agent.checkpoints.ckptstore import Checkpoints

log = logging.getLogger("shoal.owner")


class Owner:
    def __init__(self, ctx: AgentContext, placement: Placement) -> None:
        self.ctx = ctx
        self.node_id = ctx.node_id
        self.store = ctx.store
        self.view = ctx.view
        self.peers = ctx.peers
        self.events = ctx.events
        self.authority = ctx.authority
        self.placement = placement
        self._is_gone = ctx.mesh.is_gone
        self._publish = ctx.publish
        self._live = ctx.mesh.live_agents
        self._addr_of = ctx.mesh.addr_of
        self._on_change = ctx.changed
        self._stop_grace_s = ctx.stop_grace_s
        self.jobs: dict[str, OwnedJob] = {}
        self._placing: set[str] = set()
        self.queues = MeshQueues()
        self.policy = ctx.policy
        """This owner's read of the mesh's queue, kept while its view stays the same."""
        self._unlisted_since: dict[str, float] = {}
        """Running jobs whose runner's node record does not list them, since when (monotonic)."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._kick = asyncio.Event()
        self._replicated_to: dict[str, str] = {}
        self._subs_published: set[str] = set()
        self.deadline_misses = 0
        """Jobs of this owner whose deadline passed before they ended, said (once each)."""
        self.offers: Counter[str] = Counter()
        """Offers made to runners, by outcome (``shoal_placements_total``): started, declined,
        launch_failed, not_allowed, unanswered."""
        self.stop_why: dict[str, str] = {}
        """Why the last ask to stop a job's attempt failed, by job."""
        self.job_errors: Counter[str] = Counter()
        """Errors in one job's step of a loop over many, by step (``agent.common.eachjob``)."""
        self._handing: set[str] = set()
        """Jobs being handed to a higher-ranked owner (no placement meanwhile)."""
        self._loop_task: asyncio.Task[None] | None = None
        self.checkpoints: Checkpoints | None = None
        """Set by the agent once made: the checkpoints held here
        (``agent.checkpoints.ckptstore``)."""
        self.collector = Collector(self)
        """Pulls the jobs' checkpoints and hands them on (``agent.owning.collecting``)."""
        self._started_at = time.time()
        """A copy stored before a restart is judged by what was heard since (the sweep)."""
        self.cancels = Cancels(self)
        """The cancels, which wait for the job to stop (``agent.owning.cancelling``)."""
        self.gangs = Gangs(self)
        """The jobs on several nodes (``agent.owning.gang``)."""
        self.resizes = Resizes(self.events)
        """Elastic jobs restarting at another size (``agent.owning.elastic``)."""
        self.growth = Growth(ctx.elastic_grow_idle_s, ctx.preempt_min_run_s)
        self.prefetcher = Prefetcher(self)  # a waiting job's datasets to its likely node

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="owner-loop")

    async def close(self) -> None:
        tasks = [t for t in (self._loop_task, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_store_full_is_a_warning)

    def kick(self) -> None:
        self._kick.set()

    def queue_length(self) -> int:
        return sum(1 for j in self.jobs.values() if j.state == JobState.PENDING)

    def resume(self) -> int:
        """After a restart: take back the jobs we owned unless a newer owner published them
        (``agent.owning.resuming.resume``). Returns how many jobs were taken back."""
        return resuming.resume(self)

    def republish_ended(self, keep_s: float, kept: int) -> int:
        """After a restart: publish again the ends of our jobs that the mesh may not have heard
        (``agent.owning.resuming.republish_ended``). Returns how many."""
        return resuming.republish_ended(self, keep_s, kept)

    # -- publishing ------------------------------------------------------------------------------

    def _save(self, job: OwnedJob, *, replicate: bool = True) -> None:
        job.gen += 1
        self.store.put_job(job.record())
        self._announce(job)
        if is_terminal(job.state):
            self.resizes.forget(job.job_id)
            self.prefetcher.placed(job, ())  # a pre-fetch for it is stale now
        if is_terminal(job.state) and self.checkpoints is not None:
            self.checkpoints.forget(job.job_id)
        if replicate:
            self.spawn(self._replicate_quietly(job))
        self._on_change()

    def _announce(self, job: OwnedJob) -> None:
        """Publish the job's record (and, the first time, the operator's submission)."""
        if job.job_id not in self._subs_published and job.submission:
            # The operator's submission goes out once per owner: what lets every member believe
            # that the job exists (its spec travels in it, not in each version of the record).
            self._subs_published.add(job.job_id)
            self._publish(SUB_PREFIX + job.job_id, job.submission)
        self._publish(JOB_PREFIX + job.job_id, gossip_payload(job.status()))

    def _move(self, job: OwnedJob, event: JobEvent) -> bool:
        try:
            job.state = transition(job.state, event)
        except IllegalTransition as exc:
            log.warning("job %s: %s", job.job_id[:8], exc)
            return False
        return True

    async def _replicate(self, job: OwnedJob) -> str | None:
        """Copy the job to its replica; the node that holds it, or None (single agent)."""
        body = job_wire(job)
        for node in rank(job.job_id, self._live()):
            if node == self.node_id:
                continue
            addr = self._addr_of(node)
            if addr is None:
                continue
            try:
                await self.peers.call(addr, "replicate", body)
            except PeerError as exc:
                log.warning("job %s: replica %s failed: %s", job.job_id[:8], node[:8], exc)
                continue
            self._replicated_to[job.job_id] = node
            await self.collector.replicated(job, node)
            return node
        return None

    async def _replicate_quietly(self, job: OwnedJob) -> None:
        await self._replicate(job)

    # -- commands --------------------------------------------------------------------------------

    async def submit(self, sub: Submission) -> dict[str, Any]:
        job_id = sub.job_id
        job = self.jobs.get(job_id)
        if job is None:
            rec = self.store.get_job(job_id)
            if rec is not None and rec.owner != self.node_id and not is_terminal(rec.state):
                job = OwnedJob.from_record(rec)
                handover.adopt(self, job, why="submitted again")
            elif rec is not None and is_terminal(rec.state):
                return {"job_id": job_id, "owner": rec.owner, "replicas": 2, "state": rec.state}
        candidates: list[Candidate] = []
        if job is None:
            job = OwnedJob(
                job_id=job_id,
                spec=sub.spec,
                state=JobState.PENDING,
                attempt=0,
                owner=self.node_id,
                runner=None,
                submitted_at=time.time(),
                submission=sub.sealed,
            )
            self.jobs[job_id] = job
            self.events.add("submitted", f"owner {self.node_id[:8]}", job_id=job_id)
            # The first placement is chosen now, so the replica's copy of the submission is
            # also the write-ahead of attempt 1: one round trip fewer before the job runs.
            candidates = [] if job.spec.is_gang else candidates_for(self, job)
            if candidates and self._addr_of(candidates[0].node_id) is not None:
                self._placing.add(job_id)
                reserve(self, job, candidates[0])
            else:
                candidates = []
                self._save(job, replicate=False)
        replica = await self._replicate(job)
        if candidates:
            # offered whatever the replica said, as the placement loop does: the job is held
            self.spawn(self._place(job, candidates, reserved=job.attempt))
        else:
            self.kick()
        others = [n for n in self._live() if n != self.node_id]
        if replica is None and others:
            raise OwnerError(503, "no replica could store the job; retry with the same job id")
        return {
            "job_id": job_id,
            "owner": self.node_id,
            "replicas": 2 if replica else 1,
            "state": job.state.value,
        }

    def _owned(self, job_id: str) -> OwnedJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise OwnerError(404, f"job {job_id} is not owned by {self.node_id[:8]}")
        if job_id in self._handing:
            raise OwnerError(409, f"job {job_id} is being handed to its next owner; retry")
        return job

    async def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel the job; answered once it has stopped (``agent.owning.cancelling``)."""
        return await self.cancels.cancel(job_id)

    async def migrate(self, job_id: str, target: str | None) -> dict[str, Any]:
        job = self._owned(job_id)
        if job.state != JobState.RUNNING or job.runner is None:
            raise OwnerError(409, f"job {job_id} is {job.state.value}, not running")
        if job.members:
            raise OwnerError(409, f"job {job_id} is a gang: a gang is not migrated")
        if target is not None and target == job.runner:
            raise OwnerError(400, "the migration target is the node the job runs on")
        if target is not None and target not in self._live():
            raise OwnerError(400, f"no live agent {target} to migrate to")
        self._move(job, JobEvent.MIGRATE)
        job.prefer, job.avoid = target, job.runner
        job.reason = f"migrating off {job.runner[:8]}"
        self._save(job)
        self.events.add("migrating", f"from {job.runner[:8]}", job_id=job_id)
        self.spawn(self._stop_until_done(job_id, job.runner, job.attempt, "migrate"))
        return {"job_id": job_id, "state": job.state.value}

    def _grow(self, grow: Grow) -> None:
        """Restart an elastic job from its checkpoint to grow it (``agent.owning.elastic``), as a
        migration that prefers its own node; the policy chooses its new size."""
        job = self.jobs[grow.job_id]
        if job.runner is None or not self._move(job, JobEvent.MIGRATE):
            return
        job.prefer, job.avoid = job.runner, None
        job.reason = f"growing from {grow.gpus} to {grow.to} GPUs onto idle ones"
        self._save(job)
        self.resizes.stopping(job.job_id, grow.gpus, "grown onto idle GPUs")
        self.resizes.growing(job.job_id, job.runner, job.devices, time.monotonic())
        self.spawn(self._stop_until_done(job.job_id, job.runner, job.attempt, "migrate"))

    # -- stopping on a runner --------------------------------------------------------------------

    async def _stop_until_done(
        self, job_id: str, runner: str, attempt: int, cause: str
    ) -> str | None:
        """Ask the runner to stop (and fence) an attempt until it confirms or is gone (None);
        why not, once it has asked :data:`STOP_TRIES` times."""
        why = "no address for it"
        for _ in range(STOP_TRIES):
            if runner not in self._live():
                return None  # its death is handled by member_gone
            addr = self._addr_of(runner)
            if addr is not None:
                try:
                    answer = decoded_answer(
                        StopAnswer.from_wire,
                        await self.peers.call(
                            addr,
                            "stop",
                            StopRequest(job_id, attempt, cause).to_wire(),
                            timeout_s=self._stop_grace_s + 10,
                        ),
                    )
                except PeerError as exc:
                    log.info("job %s: stop on %s: %s", job_id[:8], runner[:8], exc)
                    why = " ".join(str(exc).split())[:200]
                    self.stop_why[job_id] = f"{runner[:8]}: {why}"
                else:
                    if answer.exit is not None:
                        self.report_answered(runner, answer.exit)
                    else:
                        self._confirmed_gone(job_id, runner, attempt, cause)
                    return None
            await asyncio.sleep(1.0)
        return f"no confirmed stop after {STOP_TRIES} tries ({why})"

    def _confirmed_gone(self, job_id: str, runner: str, attempt: int, cause: str) -> None:
        """The runner says the attempt does not run (and will not start): requeue if live."""
        job = self.jobs.get(job_id)
        if job is not None and job.members:
            self.gangs.confirmed_gone(job, runner, attempt, cause)
            return
        if job is None or job.attempt != attempt or job.runner != runner:
            return
        if job.state in LIVE:
            self._requeue(job, f"attempt {attempt} not running on {runner[:8]} ({cause})")

    def _requeue(self, job: OwnedJob, reason: str) -> None:
        if job.state in LIVE and not self._move(job, JobEvent.REQUEUE):
            return
        if job.state == JobState.LOST:
            self._move(job, JobEvent.REQUEUE)
        job.runner, job.devices, job.reason = None, (), reason
        self._save(job)
        self.events.add("requeued", reason, job_id=job.job_id)
        self.kick()

    # -- reports from runners --------------------------------------------------------------------

    def checkpointed(self, runner: str, note: CheckpointNote) -> dict[str, Any]:
        """The runner of the current attempt says the job's checkpoint changed (``collector``)."""
        return self.collector.checkpointed(runner, note)

    def report(self, runner: str, r: AttemptResult) -> dict[str, Any]:
        """An attempt ended on ``runner``; stale reports (other attempt or runner) are dropped."""
        job = self._owned(r.job_id)
        with kept_or_undone(job):
            if job.members:
                return self.gangs.report(job, runner, r)
            if r.attempt != job.attempt or runner != job.runner or job.state not in LIVE:
                return {"ok": True, "stale": True}
            job.attempt_ended(job.attempt, r.cause, r.exit_code, finished_at(r))
            self._conclude(job, runner, r)
            return {"ok": True}

    def report_answered(self, runner: str, r: AttemptResult) -> None:
        """How an attempt ended, as the runner answered this owner's own call (a stop, a
        status). The job may have left meanwhile (handed to its next owner, or let go): that
        owner asks the runner for itself, so the answer is dropped here, not raised."""
        try:
            self.report(runner, r)
        except OwnerError as exc:
            log.debug("job %s: %s's answer dropped: %s", r.job_id[:8], runner[:8], exc)

    def _conclude(self, job: OwnedJob, runner: str, r: AttemptResult) -> None:
        """The current attempt ended with ``r`` (:func:`agent.owning.concluding.conclude`)."""
        conclude(self, job, runner, r)

    # -- membership and takeovers (``agent.owning.handover``) --------------------------------------

    def member_gone(self, node: str) -> None:
        """A node died or left: requeue what ran there; take over what it owned."""
        handover.member_gone(self, node)

    def forget(self, job_ids: list[str]) -> None:
        """Drop ended jobs from memory (retired: :mod:`agent.mesh.retiring`); the store keeps
        them."""
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            if job is not None and not is_terminal(job.state):
                continue  # ended as the mesh sees it, not here: this copy is newer
            self.jobs.pop(job_id, None)
            self._replicated_to.pop(job_id, None)
            self.collector.forget(job_id)
            self._subs_published.discard(job_id)
            self._unlisted_since.pop(job_id, None)
            self.cancels.forget(job_id)
            self.stop_why.pop(job_id, None)

    def sweep(self) -> None:
        """Adopt or hand over every stored job whose owner is gone; re-replicate ours."""
        handover.sweep(self)

    def adopt_wire(self, body: dict[str, Any], caller: str) -> dict[str, Any]:
        """Take a job over, handed by its owner or by the holder of a copy of a gone owner's."""
        return handover.adopt_wire(self, body, caller)

    # -- placement -------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):  # wait_for (3.11) loses a cancel racing a kick
                    await self._kick.wait()
            self._kick.clear()
            errors = self.job_errors
            for missed, late_s in list(newly_missed(self.jobs.values(), time.time())):
                with one_job(errors, "deadline", missed.job_id):
                    self._missed_deadline(missed, late_s)
            for grow in self.growth.due(self.jobs.values(), self.view, time.time()):
                with one_job(errors, "grow", grow.job_id):
                    self._grow(grow)
            pending = sorted(
                (j for j in self.jobs.values() if j.state == JobState.PENDING),
                key=lambda j: (-j.spec.priority, j.spec.deadline or float("inf"), j.submitted_at),
            )
            for job in pending:
                if job.job_id in self._placing or job.job_id in self._handing:
                    continue
                if not self.authority.may_own(job.job_id, self.node_id):
                    continue  # outranked (a partition healed): runners would refuse; handed over
                with one_job(errors, "place", job.job_id):
                    if self.resizes.settling(job.job_id, self.view, time.monotonic()):
                        continue  # requeued to grow: placed once the view shows its GPUs freed
                    self._placing.add(job.job_id)
                    self.spawn(self._place(job))
            now = time.monotonic()
            for job in list(self.jobs.values()):
                if (
                    job.state == JobState.PLACING
                    and job.job_id not in self._placing
                    and job.runner is not None
                    and now - job.placing_since > 15.0
                ):
                    job.placing_since = now
                    self.spawn(handover.check_runner(self, job.job_id, job.runner, job.attempt))
            self._check_unlisted(now)

    def _check_unlisted(self, now: float) -> None:
        """Ask the runner of a running job its node record has not listed for
        :data:`UNLISTED_CHECK_S` where the attempt stands (``handover.check_runner``: running,
        ended, or neither, then requeued): the owner's own check, for an end whose report never
        came (a healed partition's other owner took it as stale, or its runner gave up)."""
        unlisted: dict[str, float] = {}
        for job in self.jobs.values():
            if job.state != JobState.RUNNING or job.members or job.runner is None:
                continue
            node = self.view.nodes.get(job.runner)
            status = node.status if node is not None else None
            if status is None or job.job_id in status.running:
                continue
            since = self._unlisted_since.get(job.job_id, now)
            if now - since >= UNLISTED_CHECK_S:
                self.spawn(handover.check_runner(self, job.job_id, job.runner, job.attempt))
                since = now  # asked again after as long, if still unlisted
            unlisted[job.job_id] = since
        self._unlisted_since = unlisted

    async def _place(
        self,
        job: OwnedJob,
        candidates: list[Candidate] | None = None,
        *,
        reserved: int | None = None,
    ) -> None:
        try:
            if job.spec.is_gang:
                await self.gangs.place(job)
            else:
                await place_once(self, job, candidates, reserved)
        finally:
            self._placing.discard(job.job_id)

    def _missed_deadline(self, job: OwnedJob, late_s: float) -> None:
        job.deadline_missed_s = late_s
        self.deadline_misses += 1
        self._save(job)
        line = missed_line(late_s, job.state.value)
        self.events.add("deadline_missed", line, job_id=job.job_id)

    def _give_up(self, job: OwnedJob, reason: str) -> None:
        """A pending job that can never run: failed, with the reason."""
        if job.state == JobState.PLACING:
            self._move(job, JobEvent.DECLINED)
            job.runner, job.devices = None, ()
        if not self._move(job, JobEvent.GIVE_UP):
            return
        job.finished_at, job.reason = time.time(), reason
        self._save(job)
        self.events.add("failed", reason, job_id=job.job_id)


def _store_full_is_a_warning(task: asyncio.Task[Any]) -> None:
    """A step of a job's work that stopped because the data folder is full: one line, not a
    traceback. Nothing of the step was stored; the job's durable state is its last saved one,
    here and on its replica, and the owner takes it up from there (at the latest on restart)."""
    if task.cancelled():
        return
    exc = task.exception()
    if isinstance(exc, StoreFull):
        log.warning("a step of a job's work stopped: %s", exc)
    elif exc is not None:  # retrieved here, so said here, as asyncio would have
        log.error("a step of a job's work failed", exc_info=exc)
