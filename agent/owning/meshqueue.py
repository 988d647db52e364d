"""The mesh's one queue: the pending jobs gossip names, in the policy's order, whoever owns them.

Each owner places only the jobs it owns, but it places each behind every pending job that comes
first in the policy's queue order (:func:`agent.policy.queue.order_key`: priority, deadline,
submission time, id), whichever agent owns those. The Shoal placement runs the policy's decision
pass over them and this job (:func:`agent.policy.decision.decide`, the pass the simulator and the
TUI run), so

- a job ahead that fits now takes its room first, and a later job is not offered that room;
- the first job ahead that fits nowhere now holds a reservation on the nodes where it would
  start first, and a later job goes there only if it would end before that start (EASY backfill).

Before this, each owner's queue was its own: a 2-GPU job requeued after its runner died could
wait while other owners' 1-GPU jobs took each GPU that ended meanwhile.

Every owner sees the same records, so every owner sorts the same jobs the same way. Gossip lags:
a job that has just started may still be pending here for a moment, and then holds room it does
not need until its record arrives; the job first in the order is never held back by another.
At most :data:`MAX_AHEAD` jobs ahead are taken (the first in the order), so a pass stays cheap
behind a long queue. The first-fit baseline keeps no order across owners (``placement = "fifo"``).

An owner builds the order once per change of its view (:class:`QueueIndex`, kept while
``ClusterView.generation`` stays the same) and every job of its own among the first
:data:`MAX_AHEAD` is given the same pass (``MeshQueue.behind``: the jobs after it in that pass),
so one decision pass serves all of them (``agent.owning.placement.ShoalPlacement`` keeps it).

With a team policy that gives any team a quota (:mod:`agent.owning.teamquotas`), every job of the
pass carries its team and user, the running jobs theirs, and every job is given the whole pass
(with what runs), even the first in the order: the decision pass re-orders by fair share and
counts each team's GPUs, so what the order key puts first may wait for its team's maximum.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agent.job.jobspec import JobSpec
from agent.job.jobstate import JobState
from agent.owning.teamquotas import TeamsNow, teams_now
from agent.policy import adapt
from agent.policy.queue import order_key
from agent.policy.snapshot import Job, Running
from agent.policy.teams import Teams

if TYPE_CHECKING:
    from agent.job.authority import Submission
    from agent.mesh.view import ClusterView
    from agent.wire.policy import PolicyBody

MAX_AHEAD = 256
"""Pending jobs ahead of a job that its placement looks at, the first in the queue order."""


@dataclass(frozen=True, slots=True)
class MeshQueue:
    """A job as the policy orders it, the pending jobs ahead of it and the jobs that run."""

    job: Job
    ahead: tuple[Job, ...] = ()
    """Pending jobs before ``job`` in the queue order, first first."""
    running: tuple[Running, ...] = ()
    """What runs now (when each job ahead may start depends on when these end); empty when
    nothing is ahead."""
    behind: tuple[Job, ...] = ()
    """Pending jobs after ``job`` that the same decision pass takes (the pass is shared by
    every job in it; they do not change whether ``job`` starts)."""
    generation: int | None = None
    """The view's generation the queue was read at (``None``: not to be kept)."""
    teams: Teams | None = None
    """The held team policy's quotas and usage (:mod:`agent.owning.teamquotas`); ``None``: none.
    With teams, ``running`` is always given (the team's holdings count) and every job carries
    its team and user."""

    @property
    def jobs(self) -> tuple[Job, ...]:
        """The decision pass's pending jobs, in order."""
        return (*self.ahead, self.job, *self.behind)


class QueueIndex:
    """The mesh's pending jobs in the policy's order, read once from a view (module doc)."""

    def __init__(
        self,
        jobs: Mapping[str, Mapping[str, Any]],
        specs: Mapping[str, JobSpec],
        pending: Iterable[str],
        *,
        live: Collection[str],
        checkpoints: Callable[[], Mapping[str, float]] | None = None,
        generation: int | None = None,
        teams: TeamsNow | None = None,
    ) -> None:
        """``pending``: the ids of the jobs whose records say pending (others are skipped);
        ``checkpoints``: when each running job last saved one, asked only if a job is ahead;
        ``teams``: the team policy's quotas and each job's team (:mod:`agent.owning.teamquotas`)."""
        self._teams = teams
        order: list[tuple[tuple[float, float, float, str], Job]] = []
        for job_id in pending:
            doc = jobs.get(job_id)
            spec = specs.get(job_id)
            if doc is None or spec is None or doc.get("state") != JobState.PENDING:
                continue
            submitted = doc.get("submitted_at")
            if isinstance(submitted, bool) or not isinstance(submitted, int | float):
                continue  # no place in the order
            job = adapt.job_from_record(job_id, doc, spec)
            if teams is not None:
                job = teams.job(job)
            order.append((order_key(job), job))
        order.sort(key=lambda kj: kj[0])
        self._keys = [k for k, _ in order]
        self._jobs = [j for _, j in order]
        self._at = {j.job_id: i for i, j in enumerate(self._jobs)}
        self._shared = tuple(self._jobs[:MAX_AHEAD])
        self._args = (jobs, specs, live, checkpoints)
        self._running: tuple[Running, ...] | None = None
        self.generation = generation

    def running(self) -> tuple[Running, ...]:
        if self._running is None:
            jobs, specs, live, checkpoints = self._args
            saved = checkpoints() if checkpoints is not None else None
            running = adapt.running_from_jobs(jobs, specs, live=live, checkpoints=saved)
            if self._teams is not None:
                running = tuple(replace(r, job=self._teams.job(r.job)) for r in running)
            self._running = running
        return self._running

    def queue(self, job: Job) -> MeshQueue:
        """``job``'s place: the jobs ahead (the first :data:`MAX_AHEAD`), and, when it is
        among those first ones, the rest of the pass it shares with them."""
        at = self._at.get(job.job_id)
        listed = at is not None
        if at is None:  # not pending in the view yet: by its own order key
            at = bisect.bisect_left(self._keys, order_key(job))
        ahead = tuple(self._jobs[: min(at, MAX_AHEAD)])
        held = self._teams
        if held is not None:  # its team and user, what each team holds, and fair share count:
            job = held.job(job)  # the whole pass, whatever the order key puts first
            if listed and at < MAX_AHEAD:
                shared = self._shared[at + 1 :]
                return MeshQueue(job, ahead, self.running(), shared, self.generation, held.teams)
            return MeshQueue(job, ahead, self.running(), teams=held.teams)
        if not ahead:
            return MeshQueue(job)
        if listed and at < MAX_AHEAD:  # one of the first: it shares their pass
            return MeshQueue(job, ahead, self.running(), self._shared[at + 1 :], self.generation)
        return MeshQueue(job, ahead, self.running())


class _Specs(Mapping[str, JobSpec]):
    """The view's signed submissions' specs, by job id (read through, not copied)."""

    def __init__(self, submissions: Mapping[str, Submission]) -> None:
        self._subs = submissions

    def __getitem__(self, job_id: str) -> JobSpec:
        return self._subs[job_id].spec

    def __iter__(self) -> Iterator[str]:
        return iter(self._subs)

    def __len__(self) -> int:
        return len(self._subs)


class MeshQueues:
    """An owner's read of the mesh's queue (:class:`agent.owning.meshqueue.QueueIndex`), read again
    when its view has changed or the live agents have."""

    def __init__(self) -> None:
        self._read: tuple[tuple[int, tuple[str, ...], int], QueueIndex] | None = None

    def index(
        self,
        view: ClusterView,
        live: Collection[str],
        checkpoints: Callable[[], Mapping[str, float]],
        policy: PolicyBody | None = None,
        now: float = 0.0,
    ) -> QueueIndex:
        """The queue as ``view`` holds it now (``checkpoints``: when each running job last
        saved one, asked only if a job is ahead; ``policy``: the team policy held, whose
        quotas and teams count, with the usage decayed to ``now``)."""
        key = (view.generation, tuple(sorted(live)), id(policy))
        if self._read is None or self._read[0] != key:
            teams = teams_now(policy, view.jobs, view.submissions, now)
            index = QueueIndex(
                view.jobs,
                _Specs(view.submissions),
                view.pending,
                live=live,
                checkpoints=checkpoints,
                generation=view.generation,
                teams=teams,
            )
            self._read = (key, index)
        return self._read[1]


def mesh_queue(
    job: Job,
    jobs: Mapping[str, Mapping[str, Any]],
    specs: Mapping[str, JobSpec],
    *,
    live: Collection[str],
    checkpoints: Mapping[str, float] | None = None,
) -> MeshQueue:
    """``job``'s place in the mesh's queue, from the gossiped job records (``jobs``, as
    ``agent.mesh.view.ClusterView.jobs``) and their signed submissions (``specs``, by job id); a
    record whose submission is not held is left out. Only the jobs ahead of it are taken."""
    index = QueueIndex(jobs, specs, jobs, live=live, checkpoints=lambda: checkpoints or {})
    found = index.queue(job)
    return MeshQueue(found.job, found.ahead, found.running)
