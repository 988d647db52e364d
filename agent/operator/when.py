"""At submission: when would the job end, and does that meet its deadline?

The mesh's listings (``GET /v1/nodes`` and ``GET /v1/jobs``) made into the policy's snapshot (its
nodes with the devices running jobs hold, the jobs that run and the jobs that wait), then the
policy's own answer (:func:`agent.policy.submit.check_submission`): the predicted start and end
(p50 and p90) and, for a job with a deadline it cannot meet, the line the operator is told. The
spec's ``on_late`` label says what then happens to it: ``queue`` (the default: submitted, with
a warning) or ``refuse`` (``shoal submit`` refuses it, exit 2, unless ``--anyway``).

For the operator's views (the TUI's jobs table), :func:`outlook` answers the same for every job the
listings hold: the predicted start and end of each live job and the line of each one that waits.

The prediction uses what this process knows: the catalog's speeds and Gavel's matrix, and work
from the job's ``max_runtime_s`` when it has one (else the model's prior for a job of its kind).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from agent.job.jobspec import JobSpec
from agent.operator.fit import BUSY_JOB_STATES, LIVE_STATES, decode_node, policy_node
from agent.policy.adapt import job_from_spec
from agent.policy.decision import decide
from agent.policy.forecast import Forecast
from agent.policy.model import ThroughputModel
from agent.policy.snapshot import Job, Node, Placement, Running, Snapshot
from agent.policy.submit import SubmissionCheck, check_submission
from agent.wire.codec import WireError
from agent.wire.documents import JobDoc


def _jobs(
    jobs: Sequence[Mapping[str, Any]],
) -> tuple[list[tuple[JobDoc, Job]], dict[str, dict[str, str]]]:
    """Live jobs as the policy sees them, and who holds which device (by node)."""
    out: list[tuple[JobDoc, Job]] = []
    holders: dict[str, dict[str, str]] = {}
    for raw in jobs:
        try:
            doc = JobDoc.from_wire(raw)
            spec = JobSpec.from_dict(doc.spec)
        except (WireError, ValueError):
            continue  # a job this version cannot read is not counted
        s = doc.status
        if s.state not in (*BUSY_JOB_STATES, "pending"):
            continue
        out.append((doc, job_from_spec(s.job_id, spec, submitted_at=s.submitted_at or 0.0)))
        if s.state in BUSY_JOB_STATES and s.runner:
            held = holders.setdefault(s.runner, {})
            held.update((key, s.job_id) for key in s.devices)
    return out, holders


def snapshot_of(
    nodes: Sequence[Mapping[str, Any]], jobs: Sequence[Mapping[str, Any]], now: float
) -> Snapshot:
    """The policy's snapshot of the mesh as the listings show it at ``now``."""
    live, holders = _jobs(jobs)
    policy_nodes: list[Node] = []
    for raw in nodes:
        decoded = decode_node(raw)
        if decoded is None:
            continue
        node, devices = decoded
        if node.state in LIVE_STATES and node.role in ("agent", None):
            policy_nodes.append(policy_node(node, devices, holders.get(node.node_id, {})))
    running: list[Running] = []
    pending: list[Job] = []
    for doc, job in live:
        s = doc.status
        if s.state == "pending":
            pending.append(job)
        elif s.runner:
            placement = Placement((s.runner,), (tuple(s.devices),))
            started = s.started_at if s.started_at is not None else now
            running.append(
                Running(
                    job,
                    placement,
                    started,
                    progress=doc.progress,
                    progress_at=now,
                    eta_s=doc.eta_s,
                )
            )
    return Snapshot(
        now=now, nodes=tuple(policy_nodes), pending=tuple(pending), running=tuple(running)
    )


def when(
    spec: JobSpec,
    nodes: Sequence[Mapping[str, Any]],
    jobs: Sequence[Mapping[str, Any]],
    now: float,
    job_id: str = "submitted",
) -> SubmissionCheck:
    """The policy's answer for ``spec`` submitted into the mesh the listings show."""
    snapshot = snapshot_of(nodes, jobs, now)
    job = job_from_spec(job_id, spec, submitted_at=now)
    return check_submission(job, snapshot, ThroughputModel())


class Outlook(NamedTuple):
    """The policy's view of every live job in the listings."""

    forecasts: Mapping[str, Forecast]
    """Job id -> predicted start and end (p50, p90; ``inf`` when it may never start)."""
    waiting: Mapping[str, str]
    """Job id -> why it waits, in one line, for each pending job the policy would not start."""


def outlook(
    nodes: Sequence[Mapping[str, Any]], jobs: Sequence[Mapping[str, Any]], now: float
) -> Outlook:
    """One decision pass over the mesh the listings show, with forecasts: what the owners'
    policy predicts for each live job and says of each waiting one."""
    decisions = decide(snapshot_of(nodes, jobs, now), ThroughputModel(), forecasts=True)
    return Outlook(dict(decisions.forecasts), {w.job_id: w.line for w in decisions.waiting})
