"""Queue order and EASY backfill.

One order for the whole mesh: priority (higher first), then the earliest deadline, then age (the
earliest submitted), then the job id, so every owner that sees the same jobs sorts them the same
way. Jobs start in that order while they fit. The first job that does not fit gets a reservation:
the earliest time enough capacity frees for it (the running jobs' p50 ends), on named nodes. A
later job may still start now (backfill) if it does not delay that reservation: it runs on nodes
the reservation does not name, or its p90 end comes before the reservation's start (EASY, as in
Lifka's scheduler for the IBM SP and Slurm's backfill).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.policy.snapshot import Job
from agent.policy.teams import Teams, fair_key


def order_key(job: Job) -> tuple[float, float, float, str]:
    deadline = job.deadline if job.deadline is not None else math.inf
    return (-job.priority, deadline, job.submitted_at, job.job_id)


def level(attained_gpu_s: float, levels: Sequence[float]) -> int:
    """The service level of a job that has had ``attained_gpu_s`` (0: the least)."""
    return bisect.bisect_right(levels, attained_gpu_s)


def queue_order(
    jobs: Iterable[Job], levels: Sequence[float] = (), teams: Teams | None = None
) -> list[Job]:
    """Pending jobs in the order they get capacity; with ``levels`` (time slicing), a
    preemptible job that has had more service waits behind the others of its priority; with
    ``teams``, after priority and deadline, the team that used least for its share first, then
    within a team the user that used least (:func:`agent.policy.teams.fair_key`)."""
    if not levels and teams is None:
        return sorted(jobs, key=order_key)

    def key(job: Job) -> tuple[float, float, float, float, int, float, str]:
        p, deadline, submitted, job_id = order_key(job)
        served = level(job.attained_gpu_s, levels) if levels and job.preemptible else 0
        team, user = fair_key(job, teams)
        return (p, deadline, team, user, served, submitted, job_id)

    return sorted(jobs, key=key)


@dataclass(frozen=True, slots=True)
class Reservation:
    """Capacity promised to the first job that cannot start now."""

    job_id: str
    node_ids: tuple[str, ...]
    start_at: float
    """Its predicted (p50) start."""

    def allows(self, node_ids: Iterable[str], end_p90: float) -> bool:
        """May a backfilled job on ``node_ids`` ending (p90) at ``end_p90`` start now?"""
        if end_p90 <= self.start_at:
            return True
        return not set(node_ids) & set(self.node_ids)
