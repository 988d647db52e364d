"""The owner's side of a gang (``resources.nodes > 1``): place all members or none, follow them
as one job, end or requeue them together.

An attempt of a gang is a set of members (:class:`agent.wire.records.GangMember`: rank, node,
devices), chosen by the policy as a whole (:meth:`agent.owning.placement.Placement.gang_candidates`,
which never returns part of a gang). Placing one:

1. write-ahead: the job moves to ``placing`` with its new attempt number and every member, and
   that record is copied to the replica before anything goes out, as a one-node attempt is;
2. prepare: each member's runner holds its devices for :data:`PREPARE_TTL_S`
   (``gang_prepare``, ``agent.running.gangdesk``), one after the other in **node-id order**, the one
   order every owner uses, so two owners that want overlapping nodes meet at the first node they
   share and one of them is refused there while holding nothing the other still needs;
3. on the first refusal (or no answer) every member is aborted (``gang_abort``: frees the hold and
   fences the attempt), the job goes back to ``pending`` and is tried again after a backoff that
   doubles up to :data:`MAX_BACKOFF_S`, with jitter so two owners do not retry in step; a hold
   nobody aborts runs out on its own;
4. commit: with every member held, each runner starts its member (``gang_commit``) with the
   variables ``torch.distributed`` reads, meeting at rank 0's host and the port rank 0's runner
   found free (``MASTER_ADDR``/``MASTER_PORT``, see ``agent.execution.pinning``).

Following one (:class:`GangAttempt`, sans-I/O): each member's runner reports its own end. All
members exiting 0 is success. The first member to end otherwise (a failure, a stop, a lost node,
a commit that was refused or got no answer) decides the attempt: every other member is stopped
and fenced, and only once each has confirmed (or its node is gone) does the job fail, retry or
go back to the queue as a whole, so two attempts of a gang never run at once. An owner that
takes a gang over asks every member's runner where it stands (:meth:`Gangs.check`).

A gang is not migrated (the command is refused), and its attempts start with an empty Shoal
checkpoint folder on every member: a gang that resumes keeps its checkpoints where every member
reads them (its spec's ``checkpoint_dir`` on shared storage).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agent.job.jobstate import LIVE, JobEvent, JobState
from agent.mesh.peers import PeerError, PeerRefused, PeerUnreachable
from agent.owning.datawait import STAGE_TIMEOUT_S, clear_staging, stages, watch_staging
from agent.owning.ownedjob import ATTEMPTS_KEPT
from agent.owning.ownersteps import OwnerSteps
from agent.owning.placing import queue_of
from agent.owning.prefetching import Prefetcher
from agent.wire.calls import (
    MAX_HOLD_S,
    AttemptResult,
    GangAbort,
    GangCommit,
    GangPrepare,
    GangPrepared,
    StartAnswer,
    StatusAnswer,
    StatusRequest,
)
from agent.wire.codec import MAX_RECORD_BYTES, WireError
from agent.wire.records import AttemptEntry, GangMember

if TYPE_CHECKING:
    from agent.owning.ownedjob import OwnedJob

MAX_LAUNCH_FAILURES = 3
"""Attempts whose member could not be launched (the runner's launch error) before the gang fails
with it, as :data:`agent.owning.placing.MAX_LAUNCH_FAILURES` for one node."""
PREPARE_TTL_S = MAX_HOLD_S
"""How long a runner holds a member's devices for a commit that has not come (the most a
runner grants: :data:`agent.wire.calls.MAX_HOLD_S`)."""
BASE_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
"""After a refused prepare, the gang waits ``BASE * 2**(refusals-1)`` (at most this), times a
jitter between 0.5 and 1.5, before it is placed again."""


class Step(enum.Enum):
    """What a member's end asks of the owner (:meth:`GangAttempt.end`)."""

    IGNORE = "ignore"
    """Not a member of this attempt, or its end is known already."""
    WAIT = "wait"
    """Others still run, and nothing went wrong (it exited 0)."""
    STOP_OTHERS = "stop_others"
    """The first member to end other than with 0: stop every member still running."""
    DONE = "done"
    """Every member has ended: the attempt's outcome is known (:meth:`GangAttempt.outcome`)."""


def ok(r: AttemptResult) -> bool:
    return r.cause == "exit" and r.exit_code == 0


@dataclass(slots=True)
class GangAttempt:
    """One attempt of a gang as its owner follows it (no I/O): which members ended, and how."""

    attempt: int
    members: tuple[GangMember, ...]
    ends: dict[str, AttemptResult] = field(default_factory=dict)
    """By node: how each member that ended did."""
    decided_by: str | None = None
    """The node of the first member that ended other than with 0 (its end is the outcome)."""
    committing: bool = False
    """Commits went out (or may have, after a takeover): a member's end is acted on. Before,
    the placing owner aborts the attempt itself."""

    def rank_of(self, node: str) -> int | None:
        return next((m.rank for m in self.members if m.node == node), None)

    def end(self, node: str, result: AttemptResult) -> Step:
        """Member on ``node`` ended with ``result``; what to do next."""
        if self.rank_of(node) is None or node in self.ends or result.attempt != self.attempt:
            return Step.IGNORE
        self.ends[node] = result
        first_bad = not ok(result) and self.decided_by is None
        if first_bad:
            self.decided_by = node
        if len(self.ends) == len(self.members):
            return Step.DONE
        return Step.STOP_OTHERS if first_bad else Step.WAIT

    def running(self) -> list[GangMember]:
        """Members whose end is not known yet."""
        return [m for m in self.members if m.node not in self.ends]

    @property
    def done(self) -> bool:
        return len(self.ends) == len(self.members)

    def outcome(self) -> tuple[str, AttemptResult]:
        """Once done: the deciding member's node and end; when all exited 0, rank 0's node and
        the gang's end (code 0, from the first start to the last exit)."""
        if self.decided_by is not None:
            return self.decided_by, self.ends[self.decided_by]
        ends = list(self.ends.values())
        starts = [r.started_at for r in ends if r.started_at is not None]
        finishes = [r.finished_at for r in ends if r.finished_at is not None]
        first = self.members[0].node
        return first, self.ends[first]._replace(
            started_at=min(starts, default=None), finished_at=max(finishes, default=None)
        )


def fits_a_record(job: OwnedJob, members: tuple[GangMember, ...]) -> bool:
    """Whether the job's gossiped record can name every member (its attempts may be left out,
    the members cannot: every runner fences by them)."""
    bare = job.status()._replace(members=members, attempts=(), reason="x" * 200)
    return len(bare.encode()) <= MAX_RECORD_BYTES


def backoff_s(refusals: int, rng: random.Random) -> float:
    """How long a gang waits after its ``refusals``-th refused placement in a row."""
    doubled = BASE_BACKOFF_S * float(2 ** max(refusals - 1, 0))
    return min(MAX_BACKOFF_S, doubled) * rng.uniform(0.5, 1.5)


def prepare_order(members: tuple[GangMember, ...]) -> list[GangMember]:
    """The one order every owner prepares in: by node id."""
    return sorted(members, key=lambda m: m.node)


def describe(result: AttemptResult) -> str:
    if result.cause == "exit":
        return f"exited with {result.exit_code}"
    return result.cause


class GangOwner(OwnerSteps, Protocol):
    """What the gang code uses of the owner it works for (:class:`agent.owning.owner.Owner`): its
    view and peers, and its steps of one job's life (``agent.owning.ownersteps``), and how it ends a
    job."""

    prefetcher: Prefetcher

    def _conclude(self, job: OwnedJob, runner: str, r: AttemptResult) -> None: ...


class Gangs:
    """The gangs an :class:`agent.owning.owner.Owner` owns: placing, following, ending them."""

    def __init__(
        self, owner: GangOwner, *, ttl_s: float = PREPARE_TTL_S, rng: random.Random | None = None
    ) -> None:
        self.o = owner
        self.ttl_s = ttl_s
        self._rng = rng or random.Random()
        self.attempts: dict[str, GangAttempt] = {}
        self._refusals: Counter[str] = Counter()
        self._not_before: dict[str, float] = {}

    def _attempt(self, job: OwnedJob) -> GangAttempt | None:
        if not job.members:
            return None
        a = self.attempts.get(job.job_id)
        if a is None or a.attempt != job.attempt or a.members != job.members:
            a = GangAttempt(job.attempt, job.members)
            self.attempts[job.job_id] = a
        return a

    # -- placing ---------------------------------------------------------------------------------

    async def place(self, job: OwnedJob) -> None:
        """Place the pending gang ``job`` on a whole member set, or on none (module doc)."""
        o = self.o
        if time.monotonic() < self._not_before.get(job.job_id, 0.0):
            return
        live = set(o._live())
        nodes = [o.view.node(n) for n in sorted(live)]
        exclude = frozenset({job.avoid}) if job.avoid else frozenset()
        queue = queue_of(o, job, live)
        sets = o.placement.gang_candidates(job.spec, nodes, exclude=exclude, queue=queue)
        if not sets and job.avoid:
            sets = o.placement.gang_candidates(job.spec, nodes, queue=queue)
        if not sets:
            o.prefetcher.waiting(job, nodes, queue, live)
            reason = o.placement.why_pending(job.spec, queue)
            if reason != job.reason:
                job.reason = reason
                o._save(job, replicate=False)
            return
        members = tuple(GangMember(r, c.node_id, c.devices) for r, c in enumerate(sets[0]))
        if not fits_a_record(job, members):
            o._give_up(job, f"its {len(members)} members do not fit in one job record")
            return
        addrs = {m.node: o._addr_of(m.node) for m in members}
        if any(a is None for a in addrs.values()) or job.state != JobState.PENDING:
            return
        attempt = self._write_ahead(job, members)
        await o._replicate(job)
        a = self._attempt(job)
        assert a is not None
        refusal, master = await self._prepare_all(job, a, addrs)
        if refusal is None and master is not None and self._placing(job, attempt):
            await self._commit_all(job, a, addrs, master)
            return
        await self._abort_all(job, attempt, addrs)
        if not self._placing(job, attempt):
            return
        if not o._move(job, JobEvent.DECLINED):
            return
        self.attempts.pop(job.job_id, None)
        self._refusals[job.job_id] += 1
        wait_s = backoff_s(self._refusals[job.job_id], self._rng)
        self._not_before[job.job_id] = time.monotonic() + wait_s
        job.runner, job.devices, job.members = None, (), ()
        job.reason = f"gang attempt {attempt} declined by {refusal}; again in {wait_s:.1f} s"
        o.offers["declined"] += 1
        o._save(job, replicate=False)
        o.events.add("declined", job.reason, job_id=job.job_id)

    def _placing(self, job: OwnedJob, attempt: int) -> bool:
        a = self.attempts.get(job.job_id)
        return (
            job.attempt == attempt
            and job.state == JobState.PLACING
            and a is not None
            and a.decided_by is None
        )

    def _write_ahead(self, job: OwnedJob, members: tuple[GangMember, ...]) -> int:
        """Pending -> placing with every member, saved here (the caller replicates it)."""
        o = self.o
        o._move(job, JobEvent.PLACED)
        job.attempt += 1
        job.refused_by = None
        job.members = members
        job.runner, job.devices = members[0].node, members[0].devices
        job.placing_since = time.monotonic()
        job.reason = None
        o._save(job, replicate=False)
        return job.attempt

    async def _prepare_all(
        self, job: OwnedJob, a: GangAttempt, addrs: dict[str, str | None]
    ) -> tuple[str | None, tuple[str, int] | None]:
        """Hold every member, in node-id order; the first refusal (``node: reason``) or None,
        and where rank 0 said the members meet."""
        o = self.o
        master: tuple[str, int] | None = None
        body = GangPrepare(
            job.job_id, a.attempt, o.node_id, a.members, job.submission, self.ttl_s, rebind=True
        ).to_wire()
        for m in prepare_order(a.members):
            if not self._placing(job, a.attempt):
                return "the attempt ended while it was placed", None
            addr = addrs[m.node]
            try:
                answer = GangPrepared.from_wire(
                    await o.peers.call(addr or "", "gang_prepare", body)
                )
            except PeerRefused as exc:
                return f"{m.node[:8]}: {exc.reason}", None
            except (PeerError, WireError) as exc:
                return f"{m.node[:8]}: no answer ({exc})", None
            if m.rank == 0:
                if answer.master_addr is None or answer.master_port is None:
                    return f"{m.node[:8]}: rank 0 named no address to meet at", None
                master = (answer.master_addr, answer.master_port)
            if answer.devices and answer.devices != m.devices:
                if len(answer.devices) != len(m.devices):
                    return (
                        f"{m.node[:8]}: held {len(answer.devices)} devices, not {len(m.devices)}",
                        None,
                    )
                rebind_member(job, a, m._replace(devices=answer.devices))
                o.offers["rebound"] += 1
        return None, master

    async def _abort_all(self, job: OwnedJob, attempt: int, addrs: dict[str, str | None]) -> None:
        """Free every member's hold of ``attempt`` and fence it (a hold no abort reaches runs
        out on its own; nothing was committed, so nothing runs)."""
        body = GangAbort(job.job_id, attempt).to_wire()

        async def one(addr: str | None) -> None:
            if addr is None:
                return
            with contextlib.suppress(PeerError):
                await self.o.peers.call(addr, "gang_abort", body)

        await asyncio.gather(*(one(addr) for addr in addrs.values()))

    async def _commit_all(
        self,
        job: OwnedJob,
        a: GangAttempt,
        addrs: dict[str, str | None],
        master: tuple[str, int],
    ) -> None:
        o = self.o
        a.committing = True
        attempt = a.attempt
        job.attempts.extend(AttemptEntry(attempt, m.node, None, rank=m.rank) for m in a.members)
        del job.attempts[:-ATTEMPTS_KEPT]
        body = GangCommit(job.job_id, attempt, master[0], master[1]).to_wire()
        # Each member stages the job's datasets and working folder before it starts it
        # (agent.owning.datawait).
        timeout_s = STAGE_TIMEOUT_S if stages(job.spec) else None

        async def one(m: GangMember) -> float | None:
            try:
                answer = StartAnswer.from_wire(
                    await o.peers.call(
                        addrs[m.node] or "", "gang_commit", body, timeout_s=timeout_s
                    )
                )
            except PeerRefused as exc:
                if exc.status == 422:  # the member's process could not be launched
                    job.launch_failures += 1
                cause = "launch_failed" if exc.status == 422 else "declined"
                self._ended(job, m.node, _result(job.job_id, attempt, cause))
                return None
            except (PeerUnreachable, WireError):
                # It may have started: stopped (and fenced), which tells how it ended.
                o.spawn(o._stop_until_done(job.job_id, m.node, attempt, "fenced"))
                return None
            return answer.started_at or time.time()

        watches = [
            asyncio.create_task(watch_staging(o, job, m.node, attempt))
            for m in (a.members if stages(job.spec) or job.spec.image is not None else ())
        ]
        try:
            started = await asyncio.gather(*(one(m) for m in a.members))
        finally:
            for w in watches:
                w.cancel()
        clear_staging(job)
        for m, at in zip(a.members, started, strict=True):
            if at is not None:
                _entry(job, attempt, m.node, started_at=at)
        if job.attempt != attempt or job.state != JobState.PLACING or a.decided_by is not None:
            if job.attempt == attempt:
                o._save(job)
            return
        self._refusals.pop(job.job_id, None)
        self._not_before.pop(job.job_id, None)
        o.offers["started"] += 1
        o._move(job, JobEvent.RESERVED)
        o._move(job, JobEvent.STARTED)
        job.started_at = min(at for at in started if at is not None)
        o.prefetcher.placed(job, {m.node for m in a.members})
        o._save(job)
        o.events.add(
            "started",
            f"attempt {attempt} on {len(a.members)} nodes, rank 0 on {a.members[0].node[:8]}",
            job_id=job.job_id,
        )

    # -- following -------------------------------------------------------------------------------

    def report(self, job: OwnedJob, runner: str, r: AttemptResult) -> dict[str, Any]:
        """A member's runner says how its part of an attempt ended."""
        a = self._attempt(job)
        if a is None or r.attempt != job.attempt or job.state not in LIVE:
            return {"ok": True, "stale": True}
        if a.rank_of(runner) is None or runner in a.ends:
            return {"ok": True, "stale": True}
        self._ended(job, runner, r)
        return {"ok": True}

    def confirmed_gone(self, job: OwnedJob, runner: str, attempt: int, cause: str) -> None:
        """A member's runner says the attempt does not run there (and will not start)."""
        if job.attempt == attempt and job.state in LIVE:
            self._ended(job, runner, _result(job.job_id, attempt, cause))

    def member_gone(self, job: OwnedJob, node: str) -> None:
        """A member's node died or left: its part of the attempt is lost."""
        if job.state in LIVE:
            self._ended(job, node, _result(job.job_id, job.attempt, "lost"))

    def _ended(self, job: OwnedJob, node: str, r: AttemptResult) -> None:
        o = self.o
        a = self._attempt(job)
        if a is None or job.attempt != r.attempt or job.state not in LIVE:
            return
        step = a.end(node, r)
        if step is Step.IGNORE:
            return
        _entry(job, r.attempt, node, finished_at=r.finished_at or time.time(), result=r)
        if not a.committing:
            return  # the placing owner sees the attempt decided and aborts it
        if step is Step.DONE:
            self._finish(job, a)
            return
        if step is Step.STOP_OTHERS:
            rank = a.rank_of(node)
            job.reason = f"rank {rank} on {node[:8]} {describe(r)}; stopping the other members"
            o.events.add("gang_stopping", job.reason, job_id=job.job_id)
            live = set(o._live())
            for m in a.running():
                if m.node in live:
                    o.spawn(o._stop_until_done(job.job_id, m.node, a.attempt, "fenced"))
                else:
                    self._ended(job, m.node, _result(job.job_id, a.attempt, "lost"))
        if job.state in LIVE and self.attempts.get(job.job_id) is a and not a.done:
            o._save(job)

    def _finish(self, job: OwnedJob, a: GangAttempt) -> None:
        """Every member has ended: the gang succeeds, fails, retries or goes back to the queue
        as a whole, as the owner ends a one-node attempt."""
        o = self.o
        node, r = a.outcome()
        self.attempts.pop(job.job_id, None)
        self._refusals.pop(job.job_id, None)
        self._not_before.pop(job.job_id, None)
        if r.cause == "lost":
            o._move(job, JobEvent.RUNNER_DEAD)
            o.events.add("lost", f"member {node[:8]} is gone", job_id=job.job_id)
            o._requeue(job, f"gang member {node[:8]} is gone; attempt {a.attempt} lost")
        elif r.cause == "launch_failed" and job.launch_failures >= MAX_LAUNCH_FAILURES:
            o._give_up(job, f"a member could not be launched ({job.launch_failures} attempts)")
        elif r.cause in ("launch_failed", "declined"):
            o._requeue(job, f"gang attempt {a.attempt}: {node[:8]} did not start its member")
        else:
            o._conclude(job, node, r)

    async def check(self, job: OwnedJob) -> None:
        """After a takeover, or a placing that took too long: where does every member stand?
        All running: running. One that ended: as its report. One that does not run, or does
        not answer: stopped (fenced), and the gang with it."""
        o = self.o
        a = self._attempt(job)
        if a is None:
            return
        a.committing = True
        attempt = a.attempt
        live = set(o._live())
        running = 0
        for m in a.running():
            if job.attempt != attempt or job.state not in LIVE:
                return
            if m.node not in live:
                self._ended(job, m.node, _result(job.job_id, attempt, "lost"))
                continue
            addr = o._addr_of(m.node)
            try:
                answer = StatusAnswer.from_wire(
                    await o.peers.call(addr or "", "status", StatusRequest(job.job_id).to_wire())
                )
            except (PeerError, WireError):
                o.spawn(o._stop_until_done(job.job_id, m.node, attempt, "fenced"))
                continue
            if answer.running and answer.attempt == attempt:
                running += 1
            elif answer.result is not None and answer.result.attempt == attempt:
                self._ended(job, m.node, answer.result)
            else:
                o.spawn(o._stop_until_done(job.job_id, m.node, attempt, "fenced"))
        if running == len(a.members) and job.attempt == attempt and job.state == JobState.PLACING:
            o._move(job, JobEvent.STARTED)
            o._save(job)

    def stop_all(self, job: OwnedJob, attempt: int, cause: str) -> None:
        """Stop (and fence) every member of ``attempt`` (a cancel: nothing is requeued)."""
        for m in job.members:
            self.o.spawn(self.o._stop_until_done(job.job_id, m.node, attempt, cause))


def _result(job_id: str, attempt: int, cause: str) -> AttemptResult:
    return AttemptResult(job_id, attempt, None, None, cause, None, time.time())


def _entry(
    job: OwnedJob,
    attempt: int,
    node: str,
    *,
    started_at: float | None = None,
    finished_at: float | None = None,
    result: AttemptResult | None = None,
) -> None:
    """Note a member's start or end in the job's attempts (one entry per member)."""
    for i in range(len(job.attempts) - 1, -1, -1):
        e = job.attempts[i]
        if e.attempt == attempt and e.node == node:
            if started_at is not None and e.started_at is None:
                e = e._replace(started_at=started_at)
            if result is not None and e.cause is None:
                e = e._replace(
                    finished_at=finished_at,
                    cause=result.cause,
                    exit_code=result.exit_code,
                    started_at=e.started_at or result.started_at,
                )
            job.attempts[i] = e
            return


def rebind_member(job: OwnedJob, a: GangAttempt, member: GangMember) -> None:
    """A member's runner held other devices of the same models than those offered (late
    binding): the attempt and the job's record name them from now on (saved at the start)."""
    a.members = tuple(member if m.rank == member.rank else m for m in a.members)
    if job.attempt == a.attempt:
        job.members = a.members
        if member.rank == 0:
            job.devices = member.devices
