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
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from agent.jobspec import JobSpec
from agent.jobstate import JobState
from agent.policy import adapt
from agent.policy.queue import order_key
from agent.policy.snapshot import Job, Running

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


def mesh_queue(
    job: Job,
    jobs: Mapping[str, Mapping[str, Any]],
    specs: Mapping[str, JobSpec],
    *,
    live: Collection[str],
    checkpoints: Mapping[str, float] | None = None,
) -> MeshQueue:
    """``job``'s place in the mesh's queue, from the gossiped job records (``jobs``, as
    ``agent.view.ClusterView.jobs``) and their signed submissions (``specs``, by job id); a
    record whose submission is not held is left out."""
    mine = order_key(job)
    ahead: list[Job] = []
    for job_id, doc in jobs.items():
        if job_id == job.job_id or doc.get("state") != JobState.PENDING:
            continue
        spec = specs.get(job_id)
        submitted = doc.get("submitted_at")
        if spec is None or isinstance(submitted, bool) or not isinstance(submitted, int | float):
            continue
        owner = doc.get("owner")
        other = adapt.job_from_spec(
            job_id,
            spec,
            owner=owner if isinstance(owner, str) else None,
            submitted_at=float(submitted),
        )
        if order_key(other) < mine:
            ahead.append(other)
    if not ahead:
        return MeshQueue(job)
    first = heapq.nsmallest(MAX_AHEAD, ahead, key=order_key)
    running = adapt.running_from_jobs(jobs, specs, live=live, checkpoints=checkpoints)
    return MeshQueue(job, tuple(first), running)
