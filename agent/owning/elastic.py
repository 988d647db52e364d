"""An owner's elastic jobs: the resizes it has under way, and the events that say them.

An elastic job (``resources.gpus_max_per_node``: a range of GPUs on one node) changes size only
by restarting from its checkpoint: it is stopped (cause ``shrink`` when a runner gives its GPUs to
a job that waits, :mod:`agent.policy.shrink`), requeued by its owner, and placed again by the
policy with as many GPUs as then fit; or, below its most GPUs, stopped to grow (cause
``migrate``) once GPUs it could use have been idle on its node a while (:class:`Growth`). The
owner notes the size it ran at and why when it stops, and says ``resized`` (from N to M GPUs,
why) when it starts again at another size.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from agent.job.jobstate import JobState
from agent.mesh.view import ClusterView
from agent.owning.ownedjob import OwnedJob
from agent.policy import adapt
from agent.policy.grow import grow_to
from agent.policy.snapshot import Job


class EventLog(Protocol):
    def add(self, kind: str, message: str, *, job_id: str | None = None) -> None: ...


SETTLE_S = 10.0
"""The longest a job requeued to grow waits for the view to show the devices it held free."""


class Resizes:
    """The elastic jobs an owner is restarting at another size."""

    def __init__(self, events: EventLog) -> None:
        self._events = events
        self._from: dict[str, tuple[int, str]] = {}
        self._settle: dict[str, tuple[str, frozenset[str], float]] = {}

    def growing(self, job_id: str, runner: str, devices: tuple[str, ...], now: float) -> None:
        """It stops to grow on ``runner``: it is placed again only once the view shows the
        ``devices`` it held free there (else the policy, seeing them still held, would restart it
        at the size it had), or after :data:`SETTLE_S` (``now``: monotonic seconds)."""
        self._settle[job_id] = (runner, frozenset(devices), now + SETTLE_S)

    def settling(self, job_id: str, view: ClusterView, now: float) -> bool:
        """Whether the job, requeued to grow, waits for the view to show its devices free."""
        held = self._settle.get(job_id)
        if held is None:
            return False
        runner, devices, until = held
        if now < until and not devices <= set(view.node(runner).free):
            return True
        del self._settle[job_id]
        return False

    def stopping(self, job_id: str, gpus: int, why: str) -> None:
        """``job_id`` stops at ``gpus`` GPUs to be resized, because ``why``."""
        self._from[job_id] = (gpus, why)

    def started(self, job_id: str, devices: tuple[str, ...]) -> None:
        """It started again on ``devices``: say the resize (nothing for another job)."""
        held = self._from.pop(job_id, None)
        if held is None:
            return
        gpus, why = held
        if gpus == len(devices):
            return
        self._events.add(
            "resized",
            f"from {gpus} to {len(devices)} GPU{'s' * (len(devices) != 1)} ({why})",
            job_id=job_id,
        )

    def forget(self, job_id: str) -> None:
        """It ended, or will not restart at another size."""
        self._from.pop(job_id, None)
        self._settle.pop(job_id, None)


def shrink_reason(shrunk_for: str | None) -> str:
    return f"shrunk for {shrunk_for[:8]}" if shrunk_for else "shrunk"


@dataclass(frozen=True, slots=True)
class Grow:
    """Restart ``job_id`` (running on ``gpus`` GPUs) to grow it to ``to`` GPUs."""

    job_id: str
    gpus: int
    to: int


class Growth:
    """When an owner grows its elastic jobs: a job below its most GPUs whose node has had GPUs
    it could use idle for ``idle_s`` (no job waiting that could use them: :func:`agent.policy.
    grow.grow_to`), and that has run ``min_run_s`` since it last started (never resized in a
    loop), is restarted from its checkpoint; the policy chooses its new size."""

    def __init__(self, idle_s: float, min_run_s: float) -> None:
        self.idle_s = idle_s
        self.min_run_s = min_run_s
        self._since: dict[str, float] = {}

    def due(self, jobs: Iterable[OwnedJob], view: ClusterView, now: float) -> list[Grow]:
        """The jobs of ``jobs`` (this owner's) to grow now."""
        out: list[Grow] = []
        seen: set[str] = set()
        waiting: list[Job] | None = None
        for job in jobs:
            most = job.spec.resources.gpus_max_per_node
            if job.state != JobState.RUNNING or job.runner is None or most is None:
                continue
            if len(job.devices) >= most or job.members:
                continue
            if waiting is None:
                waiting = _waiting(view)
            node = adapt.node_from_view(view.node(job.runner))
            policy_job = adapt.job_from_spec(job.job_id, job.spec)
            to = grow_to(policy_job, len(job.devices), node, waiting)
            if to is None:
                continue
            seen.add(job.job_id)
            since = self._since.setdefault(job.job_id, now)
            ran_s = now - (job.started_at or now)
            if now - since >= self.idle_s and ran_s >= self.min_run_s:
                out.append(Grow(job.job_id, len(job.devices), to))
        for job_id in list(self._since):
            if job_id not in seen:
                del self._since[job_id]
        for g in out:
            self._since.pop(g.job_id, None)
        return out


def _waiting(view: ClusterView) -> list[Job]:
    """The jobs waiting anywhere in the mesh, as the policy sees them."""
    out: list[Job] = []
    for job_id, doc in view.jobs.items():
        sub = view.submissions.get(job_id)
        if doc.get("state") == "pending" and sub is not None:
            out.append(adapt.job_from_spec(job_id, sub.spec))
    return out
