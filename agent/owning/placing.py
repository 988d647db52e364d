"""Placing one job on one node: the policy's candidates, offered in turn until one starts it.

The candidates come from ``Placement`` (the one policy), best first; when no node has room, the
one place the job may start by shrinking an elastic job or preempting others
(``agent.owning.preempting``); with none, the job keeps waiting and its reason says why. Each offer
is a new attempt (:func:`reserve`), written to the replica *before* the offer goes out, so whoever
takes over knows which attempt may be running where. Before the first offer the owner pulls what
the last attempt left; each offer names the newest checkpoint copy it holds and its holders,
from which the node fetches it (``agent.owning.collecting``).

An offer that got no answer is "maybe running": the owner fences that attempt on the runner (a
stop that also forbids a late start) and moves on only once it is confirmed. A runner that could
not launch the job (:data:`LAUNCH_FAILED`) counts towards :data:`MAX_LAUNCH_FAILURES`, after
which the job fails with the runner's reason. A gang is placed by ``agent.owning.gang``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from agent.job.authority import SubmissionRefused
from agent.job.jobstate import JobEvent, JobState
from agent.mesh.peers import PeerError, PeerRefused, PeerUnreachable, decoded_answer
from agent.owning.datawait import (
    STAGE_TIMEOUT_S,
    clear_staging,
    stages,
    unheld_reason,
    watch_staging,
)
from agent.owning.meshqueue import MeshQueue
from agent.owning.ownersteps import OwnerSteps
from agent.owning.preempting import (
    preemption_candidates,
    saved_at,
    stopped_head,
    waiting_reason,
)
from agent.policy import adapt
from agent.wire.calls import StartAnswer, StartOffer

if TYPE_CHECKING:
    from agent.job.authority import Authority
    from agent.owning.collecting import Collector
    from agent.owning.elastic import Resizes
    from agent.owning.ownedjob import OwnedJob
    from agent.owning.placement import Candidate
    from agent.owning.prefetching import Prefetcher

log = logging.getLogger("shoal.owner")

MAX_LAUNCH_FAILURES = 3
"""Offers that could not launch the job (the runner's launch error) before it fails with it."""
LAUNCH_FAILED = 422
"""The status a runner answers an offer with when the job's process could not be started."""
_REFUSALS = {LAUNCH_FAILED: "launch_failed", 403: "not_allowed"}
RESTORE_TIMEOUT_S = 120.0
"""How long an offer that resumes from a checkpoint may take to answer (the runner fetches the
checkpoint and copies it into the job's folder first)."""
IMAGE_PULL_TIMEOUT_S = 600.0
"""How much longer an offer of a job with an image may take to answer: the runner pulls the
image first when it lacks it (``agent.execution.containers``, which gives up on a pull after as
long)."""


class PlacingOwner(OwnerSteps, Protocol):
    """What placing one job uses of the owner it works for (:class:`agent.owning.owner.Owner`): its
    steps of one job's life (``agent.owning.ownersteps``), the authority that checks the submission,
    its checkpoint collector and elastic resizes, and how long a runner gives a job to stop."""

    authority: Authority
    resizes: Resizes
    collector: Collector
    prefetcher: Prefetcher
    _stop_grace_s: float


def queue_of(o: OwnerSteps, job: OwnedJob, live: Collection[str]) -> MeshQueue:
    """The job's place in the mesh's one queue, as this owner's gossip view holds it."""
    me = adapt.job_from_spec(job.job_id, job.spec, owner=o.node_id, submitted_at=job.submitted_at)
    policy = o.policy()
    index = o.queues.index(o.view, live, lambda: saved_at(o.view), policy, time.time())
    return index.queue(me)


def candidates_for(o: PlacingOwner, job: OwnedJob) -> list[Candidate]:
    """Where the job may run, best first; none: the reason is saved on the job."""
    live = set(o._live())
    unheld = unheld_reason(job.spec, o.view, live)
    if unheld is not None:
        if unheld != job.reason:
            job.reason = unheld
            o._save(job, replicate=False)
        return []
    nodes = [o.view.node(n) for n in sorted(live)]
    exclude = frozenset({job.avoid}) if job.avoid else frozenset()
    queue = queue_of(o, job, live)
    candidates = o.placement.candidates(
        job.spec, nodes, exclude=exclude, prefer=job.prefer, queue=queue
    )
    if not candidates and job.avoid:
        candidates = o.placement.candidates(job.spec, nodes, prefer=job.prefer, queue=queue)
    if not candidates:
        candidates = preemption_candidates(o.placement, job.spec, nodes, o.view, live, queue)
    if not candidates:
        o.prefetcher.waiting(job, nodes, queue, live)
        reason = waiting_reason(job.reason, o.placement.why_pending(job.spec, queue))
        if reason != job.reason:
            job.reason = reason
            o._save(job, replicate=False)
    return candidates


def reserve(o: PlacingOwner, job: OwnedJob, cand: Candidate) -> int:
    """Pending -> placing on ``cand``, saved here; the caller makes it durable on the replica
    before the offer (write-ahead: a successor must know this attempt). The attempt.

    ``cand``'s devices are held from now (``Placement.reserving``): while the offer is on its
    way the job is neither pending nor running in the view, and another job's pass would see them
    free (CI: a team's job placed while fair share's pick was being offered the same GPU)."""
    o.placement.reserving(cand)
    o._move(job, JobEvent.PLACED)
    if job.refused_by != cand.node_id:
        job.attempt += 1
    job.refused_by = None
    job.runner, job.devices = cand.node_id, cand.devices
    job.placing_since = time.monotonic()
    job.reason = stopped_head(job.reason)  # said until it runs again
    o._save(job, replicate=False)
    return job.attempt


async def place_once(
    o: PlacingOwner,
    job: OwnedJob,
    candidates: list[Candidate] | None = None,
    reserved: int | None = None,
) -> None:
    """Offer the job to each candidate in turn until one starts it. ``reserved``: the first
    candidate already holds this attempt, made durable with the submission."""
    try:
        o.authority.submission(job.submission, job.job_id)
    except SubmissionRefused as exc:
        o._give_up(job, str(exc))
        return
    if reserved is None:
        await o.collector.collect_last(job)
        if job.state != JobState.PENDING:
            return
    if candidates is None:
        candidates = candidates_for(o, job)
    declines: list[str] = []
    for i, cand in enumerate(candidates):
        if i == 0 and reserved is not None:
            attempt = reserved
            if job.attempt != attempt or _state(job) != JobState.PLACING:
                return  # cancelled meanwhile
            addr = o._addr_of(cand.node_id)
            if addr is None:  # gone since the submission: the next candidate
                o._move(job, JobEvent.DECLINED)
                job.runner, job.devices = None, ()
                continue
        else:
            if job.state != JobState.PENDING:
                return
            addr = o._addr_of(cand.node_id)
            if addr is None:
                continue
            attempt = reserve(o, job, cand)
            await o._replicate(job)
        try:
            resume = await o.collector.resume_from(job, cand.node_id)
        except (PeerError, OSError) as exc:
            declines.append(f"{cand.node_id[:8]}: checkpoint not sent ({exc})")
            if job.attempt == attempt and _state(job) == JobState.PLACING:
                o._move(job, JobEvent.DECLINED)
                job.runner, job.devices = None, ()
                job.refused_by = cand.node_id
            continue
        if job.attempt != attempt or _state(job) != JobState.PLACING:
            return  # cancelled meanwhile
        offer = StartOffer(
            job.job_id,
            attempt,
            o.node_id,
            cand.devices,
            job.submission,
            resume,
            cand.victims,
            cand.shrink,
            rebind=True,
            moves=cand.moves,
        )
        watch = None
        try:
            # A resumed attempt's checkpoint is fetched into its folder before it starts; a
            # preempting one waits for its victims to stop first; datasets are staged first.
            slow = resume is not None or cand.victims or cand.shrink or cand.moves
            timeout_s = RESTORE_TIMEOUT_S + o._stop_grace_s if slow else None
            if stages(job.spec):
                timeout_s = max(timeout_s or 0.0, STAGE_TIMEOUT_S)
                watch = asyncio.create_task(watch_staging(o, job, cand.node_id, attempt))
            if job.spec.image is not None:  # the runner pulls an image it lacks first
                timeout_s = (timeout_s or 0.0) + IMAGE_PULL_TIMEOUT_S
                if watch is None:  # its reason says so ("pulling image ...")
                    watch = asyncio.create_task(watch_staging(o, job, cand.node_id, attempt))
            answer = decoded_answer(
                StartAnswer.from_wire,
                await o.peers.call(addr, "start", offer.to_wire(), timeout_s=timeout_s),
            )
        except PeerRefused as exc:
            o.offers[_REFUSALS.get(exc.status, "declined")] += 1
            o.placement.offered(cand)
            declines.append(f"{cand.node_id[:8]}: {exc.reason}")
            log.info(
                "job %s: attempt %d declined by %s: %s",
                job.job_id[:8],
                attempt,
                cand.node_id,
                exc.reason,
            )
            if job.attempt == attempt and _state(job) == JobState.PLACING:
                o._move(job, JobEvent.DECLINED)
                job.runner, job.devices = None, ()
                job.refused_by = cand.node_id
                if exc.status == LAUNCH_FAILED:
                    job.launch_failures += 1
                    if job.launch_failures >= MAX_LAUNCH_FAILURES:
                        o._give_up(job, f"{exc.reason} ({job.launch_failures} attempts)")
                        return
            continue
        except PeerUnreachable as exc:
            o.offers["unanswered"] += 1
            log.info("job %s: start on %s unanswered: %s", job.job_id[:8], cand.node_id, exc)
            await o._stop_until_done(job.job_id, cand.node_id, attempt, "fenced")
            return
        finally:
            if watch is not None:
                watch.cancel()
        if job.attempt != attempt or _state(job) != JobState.PLACING:
            return  # cancelled or reported meanwhile
        o.offers["started"] += 1
        o.placement.offered(cand)
        if answer.devices:  # taken meanwhile: the runner chose others of the same models
            o.offers["rebound"] += 1
            cand = replace(cand, devices=answer.devices)
            o.placement.offered(cand)
        o._move(job, JobEvent.RESERVED)
        o._move(job, JobEvent.STARTED)
        job.devices = cand.devices
        job.reason = None
        job.started_at = answer.started_at or time.time()
        job.attempt_started(cand.node_id, job.started_at)
        clear_staging(job)
        o.prefetcher.placed(job, (cand.node_id,))
        o._save(job)
        o.events.add("started", f"attempt {attempt} on {cand.node_id[:8]}", job_id=job.job_id)
        o.resizes.started(job.job_id, cand.devices)
        return
    if job.state == JobState.PENDING:
        if declines:
            job.reason = waiting_reason(job.reason, "declined by " + "; ".join(declines))
        o._save(job, replicate=False)


def _state(job: OwnedJob) -> JobState:
    """The job's state through a call: it changes across awaits (keeps mypy from narrowing)."""
    return job.state
