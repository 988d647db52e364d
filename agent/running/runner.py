"""The runner side of the job protocol: admit, start, stop, fence, drain, report, reconcile.

A runner admits an offer against its real local state (drain state, devices free here, no newer
attempt fenced, the spec's hard filters against its own inventory, and room for a share of a GPU
in its device's memory: ``agent.running.admission``) and starts it at once through the executor. It
reports every ended attempt to the job's current owner and records it in its store.

Fencing: ``fence.get(job)`` (:class:`agent.running.fencing.Fences`) is the highest attempt this node
must not start (again). A ``stop`` from the owner raises it, so an offer that arrives late cannot
start a copy the owner already gave up on; a gossiped job record naming a newer attempt, another
runner, or a cancellation stops the local copy (cause ``fenced`` or ``cancel``).

Gangs: a gang's member is held here between the owner's prepare and commit
(``agent.running.gangdesk``, :class:`agent.running.reservations.Reservations`): its devices are busy
for every other offer and in the free devices gossiped, until the commit starts it (through
:meth:`Runner.launch`), an abort or a ``stop`` frees them, or the hold runs out. A started member is
an ordinary run here.

Preemption: an offer may name running jobs to stop first; the runner re-checks them itself
(``agent.running.preemption``), refuses the offer with one line when they do not qualify, else stops
them with cause ``preempt`` and starts the job on the devices they held.

Shutdown (SIGTERM): offers are declined from then on; running jobs are stopped with their
checkpoint signal (cause ``shutdown``) and reported, so their owners requeue them elsewhere; the
agent then leaves the mesh.

This module holds :class:`Runner` (what it answers and holds, its errors and a run here, are
``agent.running.runs``'): offers (admit, launch), stops and status, the executor's
events, shutdown, and the logs. Its parts depend on a protocol of what they use of
it, not on this module:

- ``agent.running.reports``: the reports of ended attempts, told to each job's owner until it has
  heard;
- ``agent.running.launching``: what a launch prepares (datasets, working folder, environment)
  and books once started (the attempt's accounting row);
- ``agent.running.offering``: an owner's offer checked (its submission, the team's quota), then
  admitted and launched;
- ``agent.running.runnerckpt``: an attempt starts from the checkpoint its offer names or from an
  empty folder; a change in a running job's checkpoint folder is told to its owner, which pulls a
  copy;
- ``agent.running.confirming``: an attempt starts only once the job's other owner confirms it (and
  this runner answers as one, fencing the older copies of a job once it confirms a newer attempt);
- ``agent.running.fencing`` (sans-I/O): when a gossiped job record stops the attempt running here
  (for a gang's, unless the record names this node among the attempt's ``members``);
- ``agent.running.draining``: cordon, drain (the grace period, then cause ``drain``) and undrain;
- ``agent.running.lostruns``: after a restart, the runs recorded before it: killed, fenced, reported
  lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.content.fetch import FetchError
from agent.execution.executor import ExecEvent, Exited, ProcessExecutor, ProgressChanged, StopCause
from agent.execution.launch import LaunchError, NoRoom
from agent.execution.logfiles import Earlier, TailReader
from agent.execution.pinning import GangRank
from agent.job.jobspec import JobSpec, check_job_id
from agent.job.jobstate import TERMINAL_JOB_STATES, DrainEvent, NodeDrainState, accepts_work
from agent.mesh.context import AgentContext
from agent.mesh.peers import PeerError
from agent.running import offering
from agent.running.admission import NodeFacts, NotAdmitted, Rebind, admit_or_rebind, local_node
from agent.running.confirming import Confirmer
from agent.running.datastage import BadDatasets, JobData, StagingFailed
from agent.running.draining import Drain
from agent.running.fencing import Fences, fence_cause
from agent.running.launching import book_opened, prepare_launch
from agent.running.lostruns import reconcile_lost
from agent.running.preemption import Ask, Preemptions, Refused
from agent.running.pyenvs import EnvBuildFailed, NoBuilder, PythonEnvs
from agent.running.reports import Reports, attempt_result
from agent.running.reservations import Reservations
from agent.running.runnerckpt import RunnerCheckpoints
from agent.running.runs import (
    Admitted,
    Declined,
    LaunchFailed,
    LocalDevices,
    LocalRun,
    NotAllowed,
    UsageSink,
)
from agent.running.teamdesk import TeamDesk
from agent.storage.sqlitefile import StoreError
from agent.storage.store import ResultRecord, RunRecord, StoreFull
from agent.wire.calls import (
    AttemptResult,
    ResumeFrom,
    StartAnswer,
    StartOffer,
    StatusAnswer,
    StopAnswer,
    StopRequest,
)

if TYPE_CHECKING:
    from agent.checkpoints.ckptstore import Checkpoints

log = logging.getLogger("shoal.runner")

_STOP_CAUSES: frozenset[str] = frozenset(
    {"cancel", "preempt", "shrink", "migrate", "drain", "fenced", "shutdown"}
)
_FOR_ANOTHER = ("preempt", "shrink", "migrate")
"""Stop causes whose report names the job the attempt was stopped for (when it was claimed by
an offer: a user's own migration is not)."""

LOG_TAILS_AT_ONCE = 2
"""Log tails searched for at once (each reads back up to ``MAX_TAIL_BYTES``)."""

_GANG_HOLD = "(held for a gang)"
"""The holder :meth:`Runner.admit` names for a device a gang holds."""

_WHOLE = Admitted()
"""Admitted on devices given whole, preempting nothing."""


class Runner:
    def __init__(
        self,
        ctx: AgentContext,
        executor: ProcessExecutor,
        devices: LocalDevices,
        facts: NodeFacts | None = None,
        rebind: Rebind | None = None,
    ) -> None:
        """``facts``: this node's OS and labels, which an offer's spec is checked against;
        ``rebind``: the placement's choice of other devices when those offered are taken."""
        self.ctx = ctx
        self._rebind = rebind
        self.facts = facts or NodeFacts()
        self.node_id = ctx.node_id
        self.store = ctx.store
        self.view = ctx.view
        self.peers = ctx.peers
        self.events = ctx.events
        self.authority = ctx.authority
        self.executor = executor
        self._statics = devices.statics
        self._set_load = devices.set_load
        self._live = ctx.mesh.live_agents
        self._addr_of = ctx.mesh.addr_of
        self._on_change = ctx.changed
        self._stop_grace_s = ctx.stop_grace_s
        self.runs: dict[str, LocalRun] = {}
        self.teams = TeamDesk(ctx, devices.statics, self.runs)
        """The team quota checks of an offer (``agent.running.teamdesk``)."""
        self.fence = Fences(self.store.last_attempt_run)
        self.progress: dict[str, tuple[float, float | None]] = {}
        self.draining = Drain(self)
        """This node's drain state and the draining under way (``agent.running.draining``)."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self.reports = Reports(self)
        """The reports of ended attempts owed to the jobs' owners (``agent.running.reports``)."""
        self._closing = False
        self._log_tails = asyncio.Semaphore(LOG_TAILS_AT_ONCE)
        self.checkpoints: Checkpoints | None = None
        """Set by the agent once made (it reads the jobs run here through this runner)."""
        self.usage: UsageSink | None = None
        """Where each attempt's accounting row is kept; set by the agent."""
        self.data: JobData | None = None
        self.envs: PythonEnvs | None = None
        """Stages a job's datasets before it starts (``agent.running.datastage``); set by the
        agent (``None``: a spec naming datasets starts without them, as in unit tests)."""
        self.holds = Reservations()
        """Devices held for gangs between prepare and commit (``agent.running.gangdesk``)."""
        self.saved_at: dict[str, float] = {}
        """Running job -> when its checkpoint folder last changed (gossiped in the node record)."""
        self.preemptions = Preemptions(ctx.preempt_min_run_s)
        self.ckpts = RunnerCheckpoints(self)
        """The jobs' checkpoints on this side: prepared, watched, told
        (``agent.running.runnerckpt``)."""
        self.confirmer = Confirmer(self, self._addr_of, self._live)
        """Asks the job's other owner before an attempt starts here, and answers as one."""

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        self.draining.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- what we publish -------------------------------------------------------------------------

    def free_devices(self, *, but: str | None = None) -> list[str]:
        """Devices no job runs on and no gang holds (but job ``but``'s own hold)."""
        used = {k for r in self.runs.values() for k in r.devices}
        used |= self.holds.devices(time.monotonic(), but=but)
        return [s.key for s in self._statics() if s.key not in used]

    def held(self) -> dict[str, dict[str, int]]:
        """Device key -> {job -> bytes of its share, or 0 for a device given whole}."""
        out: dict[str, dict[str, int]] = {}
        for run in self.runs.values():
            for k in run.devices:
                out.setdefault(k, {})[run.job_id] = run.share_bytes
        return out

    def shares(self) -> dict[str, dict[str, int]]:
        """The devices shared by jobs that each hold part of one: key -> {job -> bytes}."""
        return {k: jobs for k, jobs in self.held().items() if all(jobs.values())}

    def _show_load(self, keys: Sequence[str]) -> None:
        held = self.held()
        for k in keys:
            self._set_load(k, list(held.get(k, {}).values()))

    # -- offers ----------------------------------------------------------------------------------

    async def start(self, offer: StartOffer, caller: str) -> StartAnswer:
        """An owner's offer, answered (``agent.running.offering``)."""
        return await offering.start(self, offer, caller)

    def authorised_spec(
        self, job_id: str, owner: str, caller: str, submission: bytes, verb: str
    ) -> JobSpec:
        """The spec of the operator's ``submission`` for ``job_id``, when ``caller`` says it is
        the job's owner and may be (``agent.running.offering``)."""
        return offering.authorised_spec(self.authority, job_id, owner, caller, submission, verb)

    async def admit(
        self,
        job_id: str,
        attempt: int,
        owner: str,
        spec: JobSpec,
        keys: tuple[str, ...],
        victims: tuple[str, ...] = (),
        shrink: tuple[str, ...] = (),
        may_rebind: bool = False,
        reclaim: bool = False,
        moves: tuple[str, ...] = (),
        owed: bool = False,
    ) -> Admitted:
        """``Declined`` unless attempt ``attempt`` may start here now on ``keys``: the agent
        runs, the node takes work, the attempt is not fenced, no newer one runs, the job's
        other owner confirms that ``owner`` placed it here (``agent.running.confirming``), the
        devices are here, free (a hold of the job itself does not count: it is its own) and meet the
        spec's hard filters (``agent.running.admission``). An older attempt of the job that still
        runs here is stopped (fenced). ``victims``: running jobs a preempting offer names, which the
        runner checks itself and claims (``agent.running.preemption``); ``shrink``: elastic ones to
        shrink, and ``moves``: ones to move off for a start its team's guarantee is ``owed``,
        checked the same way; ``may_rebind``: the offer lets this runner choose other
        devices of the same models when those offered are taken (``agent.running.admission``). What
        was admitted: the memory the job holds of its device when it is a share (0: devices given
        whole), the victims to stop before it starts, and the devices chosen instead."""
        if self._closing:
            raise Declined("the agent is shutting down")
        if not accepts_work(self.drain):
            raise Declined(f"node is {self.drain.value}")
        if attempt <= self.fence.get(job_id):
            raise Declined(f"attempt {attempt} is fenced here")
        self._older_runs(job_id, attempt)
        await self.confirmer.ask(job_id, attempt, owner)  # before anything is stopped for it
        if self._older_runs(job_id, attempt):  # checked again after the wait: fenced
            await self.executor.stop(job_id, cause="fenced", grace_s=self._stop_grace_s)
        statics = {s.key: s for s in self._statics()}
        holds = self.holds.devices(time.monotonic(), but=job_id)
        in_hold = [k for k in keys if k in holds]
        if in_hold:
            raise Declined(f"device {in_hold[0]} is in use (held for a gang)")
        claimed: tuple[str, ...] = ()
        if victims or shrink or moves:  # checked and claimed first; their devices count as free
            try:
                claimed = self.preemptions.claim(
                    Ask(job_id, spec.priority, keys, victims, shrink, reclaim, moves, owed),
                    self.runs,
                    set(self.free_devices()),
                    self.saved_at,
                )
            except Refused as exc:
                raise Declined(f"preemption refused: {exc}") from None
        holding = {
            k: {j: b for j, b in jobs.items() if j not in claimed}
            for k, jobs in self.held().items()
        }
        for k in holds:  # held for a gang: taken, as far as choosing other devices goes
            holding.setdefault(k, {})[_GANG_HOLD] = 0
        here = local_node(self.node_id, self.facts, list(statics.values()), holding)
        rebind = self._rebind if may_rebind and not claimed else None
        try:
            chosen, share_bytes = admit_or_rebind(spec, here, keys, rebind)
        except NotAdmitted as exc:
            self.preemptions.release(claimed)
            raise Declined(str(exc)) from None
        rebound = chosen if chosen != keys else ()
        return Admitted(
            share_bytes,
            claimed,
            tuple(v for v in claimed if v in shrink),
            rebound,
            tuple(v for v in claimed if v in moves),
        )

    def _older_runs(self, job_id: str, attempt: int) -> bool:
        """Whether an older attempt of the job runs here (``Declined``: this or a newer one)."""
        held = self.runs.get(job_id)
        if held is not None and held.attempt >= attempt:
            raise Declined(f"attempt {held.attempt} already runs here")
        return held is not None

    async def launch(
        self,
        job_id: str,
        attempt: int,
        owner: str,
        spec: JobSpec,
        keys: tuple[str, ...],
        resume: ResumeFrom | None = None,
        gang: GangRank | None = None,
        admitted: Admitted = _WHOLE,
    ) -> StartAnswer:
        """Start an admitted attempt (``Declined``, ``LaunchFailed`` when it could not), once
        the victims :meth:`admit` claimed are stopped."""
        statics = {s.key: s for s in self._statics()}
        run = LocalRun(
            job_id,
            attempt,
            owner,
            keys,
            share_bytes=admitted.share_bytes,
            priority=spec.priority,
            preemptible=spec.preemptible,
            gpus_min=spec.resources.gpus_per_node if spec.resources.is_elastic else None,
            movable=gang is None and spec.is_movable,
        )
        self.runs[job_id] = run
        if admitted.victims:
            ask = Ask(
                job_id, spec.priority, keys, admitted.victims, admitted.shrink, moves=admitted.moves
            )
            await self.preemptions.stop(ask, admitted.victims, self.runs, self._preempt, self._note)
        try:
            resumed = await self.ckpts.prepare(job_id, resume, spec.checkpoint_dir is None)
        except (PeerError, FetchError, StoreError, OSError, ValueError) as exc:  # ContentError too
            self.runs.pop(job_id, None)
            self._on_change()
            raise Declined(f"checkpoint: {exc}") from None
        try:
            devices = [statics[k] for k in keys]
            launch = await prepare_launch(
                self, job_id, attempt, spec, devices, gang, resumed, admitted.share_bytes
            )
            started = await self.executor.start(launch)
        except (NoRoom, StagingFailed, NoBuilder) as exc:  # not the job's fault: elsewhere
            self.runs.pop(job_id, None)
            self._on_change()
            raise Declined(str(exc)) from None
        except (LaunchError, ValueError, BadDatasets, EnvBuildFailed) as exc:
            self.runs.pop(job_id, None)
            self._on_change()
            # The offer is declined (it ran nowhere: the owner may offer this attempt again); the
            # owner tries elsewhere, and gives up after a few (a bad command fails everywhere).
            raise LaunchFailed(str(exc)) from None
        finally:
            if self.data is not None:
                self.data.started(job_id)
        if self.stopped_since(job_id, attempt):
            # Fenced by a stop, or the agent began to shut down, while it launched: end it now.
            await self.executor.stop(
                job_id, cause="shutdown" if self._closing else "fenced", grace_s=0
            )
            raise Declined(f"attempt {attempt} was stopped as it started")
        self.fence.raise_to(job_id, attempt)
        run.started_at = started.started_at
        try:
            self.store.record_run(
                RunRecord(
                    job_id,
                    attempt,
                    started.pid,
                    started.pgid,
                    started.started_at,
                    str(started.log_path),
                )
            )
        except StoreFull as exc:
            # A run this agent could not remember would outlive a restart unknown: not started.
            await self.executor.stop(job_id, cause="fenced", grace_s=0)
            raise Declined(f"cannot record the run here: {exc}") from None
        who = self.authority.submitter(run.job_id)
        book_opened(self.usage, who, run, keys, statics, started.started_at)
        self._show_load(keys)
        self._on_change()
        self.events.add("running", f"attempt {attempt} pid {started.pid}", job_id=job_id)
        if resumed and resume is not None:
            self.events.add(
                "resumed",
                f"attempt {attempt} from the checkpoint of attempt {resume.attempt}",
                job_id=job_id,
            )
        return StartAnswer(ok=True, started_at=started.started_at, pid=started.pid)

    def stopped_since(self, job_id: str, attempt: int) -> bool:
        """Whether attempt ``attempt`` was fenced, or the agent began to shut down, since it was
        admitted (``agent.running.launching`` asks while it stages)."""
        return self._closing or attempt <= self.fence.get(job_id)

    async def _preempt(self, job_id: str, attempt: int, cause: str) -> None:
        self.fence.raise_to(job_id, attempt)
        how: StopCause = "shrink" if cause == "shrink" else "preempt"
        if cause == "migrate":
            how = "migrate"
        await self.executor.stop(job_id, cause=how, grace_s=self._stop_grace_s)

    def _note(self, job_id: str, kind: str, message: str) -> None:
        self.events.add(kind, message, job_id=job_id)

    # -- checkpoints (agent.running.runnerckpt; agent.checkpoints.ckptstore.LocalJobs) -------------

    def checkpoint_folder(self, job_id: str) -> Path:
        return self.ckpts.folder(job_id)

    def last_attempt(self, job_id: str) -> tuple[int, str | None] | None:
        return self.ckpts.last_attempt(job_id)

    async def watch_checkpoints(self) -> None:
        """Tell each running job's owner when its checkpoint folder changed."""
        await self.ckpts.watch()

    async def stop(self, request: StopRequest, caller: str) -> StopAnswer:
        """Stop (and fence) an attempt; answers how it ended, or that it does not run here.
        Only the agent that started the attempt, or one that may own the job, may ask."""
        job_id = check_job_id(request.job_id)
        attempt = request.attempt
        cause = request.cause
        grace = request.grace_s
        run = self.runs.get(job_id)
        started_it = run is not None and run.owner == caller
        if not started_it and not self.authority.may_own(job_id, caller):
            raise NotAllowed(f"{caller[:8]} may not stop job {job_id}")
        self.fence.raise_to(job_id, attempt)
        if self.holds.release(job_id, attempt) is not None:
            self._on_change()
        if run is None or run.attempt > attempt:
            return StopAnswer(stopped=False)
        stop_cause: StopCause = cause if cause in _STOP_CAUSES else "cancel"  # type: ignore[assignment]
        exited = await self.executor.stop(
            job_id,
            cause=stop_cause,
            grace_s=grace if grace is not None else self._stop_grace_s,
        )
        if exited is None:
            return StopAnswer(stopped=False)
        return StopAnswer(stopped=True, exit=attempt_result(exited))

    def status(self, job_id: str) -> StatusAnswer:
        run = self.runs.get(job_id)
        results = self.store.results(job_id)
        last = results[-1] if results else None
        return StatusAnswer(
            running=run is not None,
            attempt=run.attempt if run else None,
            result=attempt_result(last) if last else None,
        )

    # -- executor events -------------------------------------------------------------------------

    def on_exec_event(self, event: ExecEvent) -> None:
        if isinstance(event, ProgressChanged):
            p = event.progress
            self.progress[event.job_id] = (p.fraction, p.eta_s)
            self._on_change()
        elif isinstance(event, Exited):
            self._exited(event)

    def _exited(self, e: Exited) -> None:
        run = self.runs.get(e.job_id)
        if run is not None and run.attempt == e.attempt:
            del self.runs[e.job_id]
            self.progress.pop(e.job_id, None)  # the node record tells running jobs' only
            self._show_load(run.devices)
        try:
            self.store.finish_run(
                ResultRecord(
                    e.job_id, e.attempt, e.exit_code, e.signal, e.cause, e.started_at, e.finished_at
                )
            )
        except StoreFull as exc:  # its owner still hears how it ended, and keeps that
            log.warning(
                "job %s: the end of attempt %d not stored: %s", e.job_id[:8], e.attempt, exc
            )
        if self.usage is not None:
            self.usage.closed(e.job_id, e.attempt, e.started_at, e.finished_at)
        if self.data is not None:
            self.spawn(self.data.ended(self.executor.job_dir(e.job_id)))
        how = f"code {e.exit_code}" if e.exit_code is not None else f"signal {e.signal}"
        self.events.add("exited", f"attempt {e.attempt} {e.cause} {how}", job_id=e.job_id)
        self._on_change()
        owner = run.owner if run is not None else None
        by = self.preemptions.stopped_for(e.job_id, e.attempt)
        report = attempt_result(e)
        self.queue_report(
            report._replace(preempted_by=by) if e.cause in _FOR_ANOTHER else report, owner
        )
        if self.drain == NodeDrainState.DRAINING and not self.runs:
            self.draining.set(DrainEvent.DRAINED)

    def queue_report(self, report: AttemptResult, owner_hint: str | None) -> None:
        self.reports.queue(report, owner_hint)

    def owner_for(self, job_id: str, hint: str | None) -> str | None:
        return self.reports.owner_for(job_id, hint)

    def moved_on(self, job_id: str, attempt: int) -> bool:
        return self.reports.moved_on(job_id, attempt)

    def forget_fences(self, job_ids: Iterable[str]) -> None:
        """Jobs let go of from disk (``agent.storage.purging``): no owner offers them any more."""
        gone = [j for j in job_ids if j not in self.runs]
        self.fence.forget(gone)
        self.confirmer.given.forget(gone)

    # -- fencing through gossip (agent.running.fencing) --------------------------------------------

    def on_job_record(self, job_id: str) -> None:
        run = self.runs.get(job_id)
        doc = self.view.jobs.get(job_id)
        ended = doc is not None and run is None and doc.get("state") in TERMINAL_JOB_STATES
        if ended and self.checkpoints is not None:
            self.checkpoints.forget(job_id)  # no attempt will resume from a copy now
        if run is None or doc is None:
            return
        cause = fence_cause(doc, run.attempt, self.node_id)
        if cause is not None:
            self.fence.raise_to(job_id, run.attempt)
            self.events.add("fencing", f"attempt {run.attempt} ({cause})", job_id=job_id)
            self.spawn(self.executor.stop(job_id, cause=cause, grace_s=self._stop_grace_s))

    # -- drain (agent.running.draining) ------------------------------------------------------------

    @property
    def drain(self) -> NodeDrainState:
        """This node's drain state, as the operator last set it and its jobs ran out."""
        return self.draining.state

    def command(self, kind: str, grace_s: float | None, default_grace_s: float) -> str:
        return self.draining.command(kind, grace_s, default_grace_s)

    # -- restart and shutdown --------------------------------------------------------------------

    def reconcile(self) -> None:
        """Processes recorded before a restart: kill survivors, report every one as lost."""
        reconcile_lost(self)

    async def shutdown(self, wait_reports_s: float = 3.0) -> None:
        self._closing = True  # an offer that arrives now would outlive the agent: decline it
        await self.executor.close()
        deadline = time.monotonic() + wait_reports_s
        while self.reports.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    # -- logs ------------------------------------------------------------------------------------

    async def tail(self, job_id: str, lines: int) -> AsyncGenerator[bytes, None]:
        """The last lines of the job's log, in blocks, read in a thread as they are taken. The
        search back from the end (up to ``MAX_TAIL_BYTES`` read) runs ``LOG_TAILS_AT_ONCE`` at
        a time."""
        path = self.executor.log_path(job_id)
        backups = self.executor.config.log_backups
        async with self._log_tails:
            reader = await asyncio.to_thread(TailReader, path, lines, backups)
        with reader:
            while block := await asyncio.to_thread(reader.read):
                yield block

    def follow(self, job_id: str, lines: int, earlier: Earlier | None = None) -> AsyncIterator[str]:
        return self.executor.follow(job_id, from_lines=lines, earlier=earlier)
