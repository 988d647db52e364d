"""Jobs changing owner: taking over a gone owner's jobs, handing jobs to the agent first in their
order, and asking a runner where an attempt stands after a takeover.

One agent owns each job (``agent.job.ownership``): the first live agent in the job's rendezvous
order. When a node dies or leaves (:func:`member_gone`), its owner requeues what ran there, and
every agent sweeps its stored copies (:func:`sweep`): a job whose owner is gone is taken over by
the next agent in its order (:func:`adopt`), or handed to it by the agent that holds the copy
(:func:`hand_over`). A job whose order now puts another agent first, live here for
:data:`HANDOVER_SETTLE_S`, is handed to it between steps; it then fetches the checkpoint copy
held here. The agent handed a job (:func:`adopt_wire`) checks who may hand it over, keeps one
copy when each side of a healed partition held it, and asks the runner where the attempt stands
(:func:`check_runner`): still running, ended (its report), or neither (fenced, then requeued).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

from agent.common.eachjob import one_job
from agent.job.jobstate import (
    LIVE,
    TERMINAL_JOB_STATES,
    UNENDED_JOB_STATES,
    JobEvent,
    JobState,
    is_terminal,
)
from agent.job.ownership import rank, replica_of
from agent.mesh.peers import PeerError, decoded_answer
from agent.mesh.view import job_gen
from agent.owning.ownedjob import OwnedJob, OwnerError, job_from_wire, job_wire
from agent.owning.ownersteps import OwnerSteps
from agent.wire.calls import StatusAnswer, StatusRequest

if TYPE_CHECKING:
    from agent.checkpoints.ckptstore import Checkpoints
    from agent.job.authority import Authority
    from agent.owning.collecting import Collector
    from agent.owning.gang import Gangs
    from agent.storage.store import JobRecord, Store
    from agent.wire.calls import AttemptResult

log = logging.getLogger("shoal.owner")

HANDOVER_SETTLE_S = 5.0
"""An agent that ranks before the owner in a job's order is handed the job once it has been
live this long here (not while a mesh forms or a member flaps)."""
UNHEARD_OWNER_GRACE_S = 10.0
"""A stored job whose owner is not live, yet not known dead or left either, is taken over only
once its copy is this old, and this agent up this long: a replica can arrive from an owner this
agent has not heard of yet, and an agent back from a restart hears the mesh again only slowly."""


class HandoverOwner(OwnerSteps, Protocol):
    """What taking over and handing over use of the owner (:class:`agent.owning.owner.Owner`): its
    steps of one job's life (``agent.owning.ownersteps``), its jobs and stored copies, whom it
    replicated each to, what it is placing or handing over, and how it follows gangs and
    checkpoints."""

    authority: Authority
    store: Store
    jobs: dict[str, OwnedJob]
    gangs: Gangs
    checkpoints: Checkpoints | None
    collector: Collector
    _handing: set[str]
    _placing: set[str]
    _replicated_to: dict[str, str]
    _started_at: float
    job_errors: Counter[str]

    def kick(self) -> None: ...
    def report_answered(self, runner: str, r: AttemptResult) -> None: ...
    def _is_gone(self, node: str) -> bool: ...
    def _on_change(self) -> None: ...
    async def _replicate_quietly(self, job: OwnedJob) -> None: ...


def member_gone(o: HandoverOwner, node: str) -> None:
    """A node died or left: requeue what ran there; take over what it owned. One job that
    fails to (``agent.common.eachjob``) stops none of the others."""
    for job in list(o.jobs.values()):
        if job.job_id in o._handing:
            continue  # its next owner checks where it runs; if it stays, _give does
        with one_job(o.job_errors, "member_gone", job.job_id):
            _runner_gone(o, job, node)
    sweep(o)


def _runner_gone(o: HandoverOwner, job: OwnedJob, node: str) -> None:
    if job.members and any(m.node == node for m in job.members):
        o.gangs.member_gone(job, node)
    elif job.runner == node and job.state in LIVE:
        o._move(job, JobEvent.RUNNER_DEAD)
        job.attempt_ended(job.attempt, "lost", None, time.time())
        o.events.add("lost", f"runner {node[:8]} is gone", job_id=job.job_id)
        o._requeue(job, f"runner {node[:8]} is gone; attempt {job.attempt} lost")


def sweep(o: HandoverOwner) -> None:
    """Adopt or hand over every stored job whose owner is gone; re-replicate ours. Each job's
    step stands alone (``agent.common.eachjob``): one that fails is logged and counted, and the
    sweep goes on with the others."""
    live = o._live()
    live_set = set(live)
    for rec in o.store.jobs(states=UNENDED_JOB_STATES):
        if rec.owner in live_set or rec.job_id in o.jobs:
            continue
        with one_job(o.job_errors, "sweep", rec.job_id):
            _take_over_copy(o, rec, live)
    _hand_over_outranked(o, live)
    for job in list(o.jobs.values()):
        if is_terminal(job.state):
            continue
        want = replica_of(job.job_id, live, o.node_id)
        if want is not None and o._replicated_to.get(job.job_id) != want:
            o._replicated_to[job.job_id] = want
            o.spawn(o._replicate_quietly(job))


def _take_over_copy(o: HandoverOwner, rec: JobRecord, live: list[str]) -> None:
    """A stored copy of a job whose owner is not live: adopted, or handed to the first of its
    order, once that owner is gone rather than not heard of yet."""
    copy = OwnedJob.from_record(rec)
    doc = o.view.jobs.get(rec.job_id)
    if doc is not None:
        if doc.get("owner") in live and doc.get("owner") != o.node_id and job_gen(doc) >= copy.gen:
            # Someone already took it over. Not a record older than this copy: that is a
            # live agent's from before it was away (its restart left the job to the owner
            # it found then, now gone too), and nobody would take the job over.
            return
        if doc.get("state") in TERMINAL_JOB_STATES:
            return
    if (
        not o._is_gone(rec.owner)
        and time.time() - max(rec.updated_at, o._started_at) < UNHEARD_OWNER_GRACE_S
    ):
        return  # not heard of yet rather than gone: it, or we, may have just joined
    new_owner = next(iter(rank(rec.job_id, live)), None)
    if new_owner is not None:
        copy.note_repaired(o.job_errors)
    if new_owner == o.node_id:
        adopt(o, copy, why=f"owner {rec.owner[:8]} is gone")
    elif new_owner is not None:
        o.spawn(hand_over(o, new_owner, copy))


async def hand_over(o: HandoverOwner, node: str, job: OwnedJob) -> bool:
    addr = o._addr_of(node)
    if addr is None:
        return False
    try:
        await o.peers.call(addr, "adopt", job_wire(job))
    except PeerError as exc:
        log.info("job %s: hand over to %s failed: %s", job.job_id[:8], node[:8], exc)
        return False
    return True


def _hand_over_outranked(o: HandoverOwner, live: list[str]) -> None:
    """Ownership follows the rendezvous order over the live agents (``agent.job.authority``): a
    job of ours whose order now puts another agent first, live for ``HANDOVER_SETTLE_S``,
    is handed to it between steps (pending and not being placed, or running). An ended job
    is handed over too: a record from an owner outside the window is not believed where the
    job was not listed yet (the other side of a healed partition, an agent that joined), so
    its last record must come from the new owner. A job of which another live agent published
    a newer record is not handed over but let go (:func:`_let_go_if_superseded`)."""
    for job in list(o.jobs.values()):
        if job.job_id in o._handing or job.job_id in o._placing:
            continue
        if job.state not in (JobState.PENDING, JobState.RUNNING) and not is_terminal(job.state):
            continue
        with one_job(o.job_errors, "hand_over", job.job_id):
            first = next(iter(rank(job.job_id, live)), o.node_id)
            if first == o.node_id or _let_go_if_superseded(o, job, live):
                continue
            if o.authority.live_for_s(first) >= HANDOVER_SETTLE_S:
                o._handing.add(job.job_id)
                o.spawn(_give(o, job, first))


def _let_go_if_superseded(o: HandoverOwner, job: OwnedJob, live: list[str]) -> bool:
    """A job we hold but no longer rank first for, of which another live agent published a newer
    record (a healed partition: each side held it, and the other side's copy went on, ended if
    either ended): ours is a stale copy. Its first agent refuses it from us (we may not hand it
    over), so it is kept as a copy, as a replica keeps one, not offered again every second.
    True when it was let go."""
    doc = o.view.jobs.get(job.job_id)
    if doc is None:
        return False
    owner = doc.get("owner")
    if not isinstance(owner, str) or owner == o.node_id or owner not in live:
        return False
    theirs_ended = doc.get("state") in TERMINAL_JOB_STATES
    if job_gen(doc) <= job.gen or (is_terminal(job.state) and not theirs_ended):
        return False
    attempt = doc.get("attempt")
    if job.state == JobState.RUNNING and (not isinstance(attempt, int) or attempt < job.attempt):
        return False  # ours runs an attempt theirs does not know: it stays followed here
    _keep_as_copy(o, job, owner, "superseded", f"{owner[:8]} published a newer record")
    return True


def _keep_as_copy(o: HandoverOwner, job: OwnedJob, owner: str, kind: str, why: str) -> None:
    """``job`` is ``owner``'s now: no longer held here as its owner, kept as a replica keeps a
    copy, and the change said (event ``kind``)."""
    del o.jobs[job.job_id]
    job.owner = owner
    o.store.put_job(job.record())
    o._replicated_to.pop(job.job_id, None)
    o.collector.forget(job.job_id)
    o.events.add(kind, why, job_id=job.job_id)
    o._on_change()


async def _give(o: HandoverOwner, job: OwnedJob, node: str) -> None:
    try:
        if not await hand_over(o, node, job):
            return
        if o.jobs.get(job.job_id) is not job:
            return
        _keep_as_copy(o, job, node, "handed_over", f"to {node[:8]}, first in its order")
        if o.checkpoints is not None:  # the new owner fetches the copy we hold
            o.spawn(o.collector.hand_copy(job.job_id, node))
    finally:
        o._handing.discard(job.job_id)
        still_ours = o.jobs.get(job.job_id) is job and job.state in LIVE
        ran_on = [m.node for m in job.members] if job.members else [job.runner]
        live = set(o._live())
        for runner in ran_on:
            if still_ours and runner is not None and runner not in live:
                member_gone(o, runner)  # it died while we were handing the job over


def adopt_wire(o: HandoverOwner, body: dict[str, Any], caller: str) -> dict[str, Any]:
    """Take a job over, handed by its owner or by the holder of a copy of a gone owner's
    job. Refused unless the submission is an operator's, this agent may own the job, and the
    caller may act as its owner here, or hands over exactly the newest record of it that
    anyone published, signed by the caller itself as its owner (an owner the window left
    behind: two agents joined ahead of it, or the mesh was still forming when it took the
    job)."""
    job = job_from_wire(body, o.authority)
    doc = o.view.jobs.get(job.job_id)
    vouched = o.authority.may_own(job.job_id, caller) or (
        doc is not None and doc.get("owner") == caller
    )
    if not vouched and not o.view.published_as_owner(job.job_id, caller, job.gen):
        raise OwnerError(403, f"{caller[:8]} may not hand over job {job.job_id}")
    if not o.authority.may_own(job.job_id, o.node_id):
        raise OwnerError(409, f"{o.node_id[:8]} is not first in job {job.job_id}'s order")
    mine = o.jobs.get(job.job_id)
    if not vouched:
        _only_its_own_word(o, job, caller, doc, mine)
    if mine is not None:  # each side of a healed partition held it: one copy goes on,
        if is_terminal(job.state) and not is_terminal(mine.state):  # the one that ended,
            job.owner, job.gen = o.node_id, max(job.gen, mine.gen)
            o.jobs[job.job_id] = mine = job
        if job.gen >= mine.gen:  # published above the other, so that every agent believes it
            mine.gen = job.gen
            o._save(mine)
        if mine.state in LIVE and (mine.runner is not None or mine.members):  # still runs?
            o.spawn(check_runner(o, mine.job_id, mine.runner or "", mine.attempt))
        return {"ok": True}
    held = o.store.get_job(job.job_id)
    if held is not None:
        mine = OwnedJob.from_record(held)  # a copy whose details are left out is at gen 0
        mine.note_repaired(o.job_errors)
        if mine.gen > job.gen:
            job = mine
    if is_terminal(job.state):  # nothing to do but say how it ended, as its owner now
        job.owner = o.node_id
        o.jobs[job.job_id] = job
        o._save(job, replicate=False)
        return {"ok": True}
    adopt(o, job, why=f"handed over by {caller[:8]}")
    return {"ok": True}


def _only_its_own_word(
    o: HandoverOwner,
    job: OwnedJob,
    caller: str,
    doc: dict[str, Any] | None,
    mine: OwnedJob | None,
) -> None:
    """A caller vouched for by nothing but a record it published itself (an owner the window
    left behind, or a member lying) hands over only a job nobody else owns: not one this agent
    owns, not one whose believed owner may own it here, not one of which this agent keeps a
    copy from another owner (a replica, about to take over from its gone owner), and never one
    this agent knows ended as live again. ``OwnerError`` 403 otherwise: the record it published
    is taken as a claim, not as authority over the job's rightful owner."""
    job_id = job.job_id
    if mine is not None:
        raise OwnerError(403, f"{caller[:8]} may not hand over job {job_id}: owned here")
    believed = doc.get("owner") if doc is not None else None
    if isinstance(believed, str) and o.authority.may_own(job_id, believed):
        raise OwnerError(403, f"{caller[:8]} may not hand over job {job_id}: {believed[:8]}'s")
    held = o.store.get_job(job_id)
    if held is not None and held.owner not in (caller, o.node_id):
        who = (held.owner or "")[:8]
        raise OwnerError(403, f"{caller[:8]} may not hand over job {job_id}: a copy of {who}'s")
    ended = (held is not None and is_terminal(held.state)) or (
        doc is not None and doc.get("state") in TERMINAL_JOB_STATES
    )
    if ended and not is_terminal(job.state):
        raise OwnerError(403, f"{caller[:8]} may not hand over job {job_id}: it ended")


def adopt(o: HandoverOwner, job: OwnedJob, *, why: str) -> None:
    doc = o.view.jobs.get(job.job_id)
    if doc is not None:
        job.merge_gossip(doc)
    if is_terminal(job.state):
        return
    job.owner = o.node_id
    o.jobs[job.job_id] = job
    o._save(job)
    o.events.add("adopted", why, job_id=job.job_id)
    if job.state in LIVE and job.runner is not None:
        o.spawn(check_runner(o, job.job_id, job.runner, job.attempt))
    elif job.state == JobState.LOST:
        o._requeue(job, "lost before the takeover")
    o.kick()


async def check_runner(o: HandoverOwner, job_id: str, runner: str, attempt: int) -> None:
    """After a takeover: is the attempt still running there, done, or never started?"""
    held = o.jobs.get(job_id)
    if held is not None and held.members and held.attempt == attempt:
        await o.gangs.check(held)
        return
    if runner not in o._live():
        job = o.jobs.get(job_id)
        if job is not None and job.attempt == attempt and job.state in LIVE:
            o._move(job, JobEvent.RUNNER_DEAD)
            o._requeue(job, f"runner {runner[:8]} is gone; attempt {attempt} lost")
        return
    addr = o._addr_of(runner)
    try:
        answer = decoded_answer(
            StatusAnswer.from_wire,
            await o.peers.call(addr or "", "status", StatusRequest(job_id).to_wire()),
        )
    except PeerError:
        o.spawn(o._stop_until_done(job_id, runner, attempt, "fenced"))
        return
    job = o.jobs.get(job_id)
    if job is None or job.attempt != attempt or job.state not in LIVE:
        return
    if answer.running and answer.attempt == attempt:
        if job.state == JobState.PLACING:
            o._move(job, JobEvent.STARTED)
            o._save(job)
        return
    result = answer.result
    if result is not None and result.attempt == attempt:
        o.report_answered(runner, result)
        return
    o.spawn(o._stop_until_done(job_id, runner, attempt, "fenced"))
