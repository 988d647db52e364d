"""Deadlines jobs miss: when a job's owner says so, and how listings mark it.

A job's ``deadline`` (epoch seconds, ``agent.job.jobspec.JobSpec.deadline``) is missed when it
passes before the job ends: while the job waits or runs, or because it ended after it. Its owner
says so once (an event ``deadline_missed``, saying by how much; ``shoal_deadline_misses_total``
counts them) and keeps how late it was with the job (``deadline_missed_s``: persisted, replicated,
handed on and gossiped), so a successor does not say it again and ``shoal jobs`` shows ``missed``.

Sans-I/O: ``now`` comes in as an argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol, TypeVar

from agent.job.jobstate import TERMINAL_JOB_STATES


def lateness_s(
    deadline: float | None, state: str, finished_at: float | None, now: float
) -> float | None:
    """How far past its deadline a job in ``state`` is, or ended; ``None`` while it is not (or
    has none, or ended in time)."""
    if deadline is None:
        return None
    if state in TERMINAL_JOB_STATES:
        if finished_at is None or finished_at <= deadline:
            return None
        return finished_at - deadline
    return now - deadline if now > deadline else None


def missed_line(late_s: float, state: str) -> str:
    """The event's words: ``missed by 4.2 s (running)``, ``missed by 3.0 min (ended
    succeeded)``."""
    if late_s < 120:
        by = f"{late_s:.1f} s"
    elif late_s < 7200:
        by = f"{late_s / 60:.1f} min"
    else:
        by = f"{late_s / 3600:.1f} h"
    return f"missed by {by} ({'ended ' if state in TERMINAL_JOB_STATES else ''}{state})"


class WithDeadline(Protocol):
    """What is read of a job the owner holds (``agent.owning.ownedjob.OwnedJob``)."""

    @property
    def deadline(self) -> float | None: ...
    @property
    def state_name(self) -> str: ...
    @property
    def finished_at(self) -> float | None: ...
    @property
    def deadline_missed_s(self) -> float | None: ...


J = TypeVar("J", bound=WithDeadline)


def newly_missed(jobs: Iterable[J], now: float) -> Iterator[tuple[J, float]]:
    """The jobs whose deadline has passed before they ended and that were not said to have
    missed it yet, each with how late it is."""
    for job in jobs:
        if job.deadline is None or job.deadline_missed_s is not None:
            continue
        late = lateness_s(job.deadline, job.state_name, job.finished_at, now)
        if late is not None:
            yield job, late
