"""The owner's side of preemption: when a pending job has no free room, ask the policy whom to
preempt, and say what happened to a job that was preempted.

The running jobs come from the gossiped job records the view believes, with priority and
preemptible from each job's own signed submission (:func:`agent.policy.adapt.running_from_jobs`);
the policy picks the cheapest legal victims (``Placement.preemption``), and the offer names them
(``StartOffer.victims``). The runner checks them again and may refuse
(``agent.running.preemption``). A job stopped for another is requeued by its own owner with the
reason "preempted by <job> on <host>", said first in its waiting line until it runs again; one
moved off for a team's guarantee (``StartOffer.moves``) with "moved off <host> for <job>", and
it is not offered to that node again straight away.
Before preempting anyone, an elastic job running above its fewest GPUs may be shrunk instead
(``Placement.shrink``; the offer's ``shrink``): its owner restarts it from its checkpoint with fewer
GPUs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agent.job.jobspec import JobSpec
from agent.mesh.view import ClusterView, NodeView
from agent.owning.meshqueue import MeshQueue
from agent.owning.placement import Candidate, Placement
from agent.policy import adapt
from agent.wire.calls import AttemptResult

PREEMPTED = "preempted by "
MOVED = "moved off "


def preemption_candidates(
    placement: Placement,
    spec: JobSpec,
    nodes: Sequence[NodeView],
    view: ClusterView,
    live: Collection[str],
    queue: MeshQueue | None = None,
) -> list[Candidate]:
    """The one place the job may start by shrinking elastic jobs (first: it needs no priority)
    or else by preempting others (as the policy decides: with team quotas, ``queue``'s teams,
    a team under its guarantee reclaims borrowed GPUs whatever their priority), or none."""
    teams = queue.teams if queue is not None else None
    elastic = any(_may_shrink(view, job_id, doc) for job_id, doc in view.jobs.items())
    if (
        not elastic
        and teams is None
        and not any(
            _may_yield(view, job_id, doc, spec.priority) for job_id, doc in view.jobs.items()
        )
    ):
        return []  # nothing that may be shrunk or stopped runs anywhere
    if queue is not None and teams is not None:
        running = queue.running  # each with its team
    else:
        specs = {j: s.spec for j, s in view.submissions.items()}
        running = adapt.running_from_jobs(view.jobs, specs, live=live, checkpoints=saved_at(view))
    found = placement.shrink(spec, nodes, running) if elastic else None
    if found is None and queue is not None and teams is not None:
        found = placement.reclaim(queue.job, nodes, running, teams)
    if found is None:
        found = placement.preemption(spec, nodes, running)
    return [found] if found is not None else []


def saved_at(view: ClusterView) -> dict[str, float]:
    """When each running job last saved its checkpoint, as its own runner's node record says
    (a node's word about a job another node runs is not taken)."""
    out: dict[str, float] = {}
    for job_id, doc in view.jobs.items():
        held = view.nodes.get(str(doc.get("runner")))
        status = held.status if held is not None else None
        if status is not None and job_id in status.saved:
            out[job_id] = status.saved[job_id]
    return out


def _may_yield(view: ClusterView, job_id: str, doc: Mapping[str, Any], priority: int) -> bool:
    sub = view.submissions.get(job_id)
    return (
        sub is not None
        and doc.get("state") == "running"
        and sub.spec.preemptible
        and sub.spec.priority < priority
    )


def _may_shrink(view: ClusterView, job_id: str, doc: Mapping[str, Any]) -> bool:
    sub = view.submissions.get(job_id)
    return sub is not None and doc.get("state") == "running" and sub.spec.resources.is_elastic


def host_name(view: ClusterView, node_id: str) -> str:
    held = view.nodes.get(node_id)
    inventory = held.inventory if held is not None else None
    return inventory.host.hostname if inventory is not None else node_id[:8]


def stopped_reason(result: AttemptResult, runner: str, view: ClusterView) -> str:
    """Why an attempt stopped on ``runner`` (other than by its own end), in one line."""
    if result.cause == "preempt" and result.preempted_by:
        return f"{PREEMPTED}{result.preempted_by[:8]} on {host_name(view, runner)}"
    if result.cause == "shrink":
        by = f" for {result.preempted_by[:8]}" if result.preempted_by else ""
        return f"shrunk{by} on {host_name(view, runner)}: restarts from its checkpoint"
    if result.cause == "migrate" and result.preempted_by:
        return (
            f"{MOVED}{host_name(view, runner)} for {result.preempted_by[:8]} (its team's "
            "guarantee): restarts from its checkpoint elsewhere"
        )
    return f"attempt {result.attempt} stopped on {runner[:8]} ({result.cause})"


def stopped_head(reason: str | None) -> str | None:
    """The preemption (or move) a job's line says first, if it says one."""
    if reason is not None and reason.startswith((PREEMPTED, MOVED)):
        return reason.split("; ", 1)[0]
    return None


def waiting_reason(current: str | None, why: str) -> str:
    """The line of a job that waits: a preemption (or a move) it suffered stays said first,
    until it runs again (offered and declined meanwhile too)."""
    head = stopped_head(current)
    if head is not None:
        return why if why.startswith(head) else f"{head}; {why}"
    return why
