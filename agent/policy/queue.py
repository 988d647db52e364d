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

import math
from collections.abc import Iterable
from dataclasses import dataclass

from agent.policy.snapshot import Job


def order_key(job: Job) -> tuple[float, float, float, str]:
    deadline = job.deadline if job.deadline is not None else math.inf
    return (-job.priority, deadline, job.submitted_at, job.job_id)


def queue_order(jobs: Iterable[Job]) -> list[Job]:
    """Pending jobs in the order they get capacity."""
    return sorted(jobs, key=order_key)


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
