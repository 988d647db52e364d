"""The answer at submission: can the job ever run, when should it end, and does that meet its
deadline. A job that can never fit is refused (the CLI exits 2 unless forced); a deadline that
cannot be met is said at once, and the job is refused or queued with a warning as its spec says
(``deadline_action``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agent.policy.config import PolicyConfig
from agent.policy.decision import decide
from agent.policy.explain import about
from agent.policy.forecast import Forecast
from agent.policy.model import ThroughputModel
from agent.policy.snapshot import Job, Snapshot
from agent.policy.state import PolicyState


@dataclass(frozen=True, slots=True)
class SubmissionCheck:
    job_id: str
    line: str
    """One line for the operator."""
    never_fits: bool = False
    forecast: Forecast | None = None
    deadline_met: bool | None = None
    """``None``: the job has no deadline (or can never run)."""
    refuse: bool = False
    """Refuse it: it can never fit, or its deadline cannot be met and it asked to be refused."""


def check_submission(
    job: Job,
    snapshot: Snapshot,
    model: ThroughputModel,
    config: PolicyConfig | None = None,
    *,
    state: PolicyState | None = None,
) -> SubmissionCheck:
    """What the policy would tell the operator submitting ``job`` into ``snapshot``."""
    pending = (*(j for j in snapshot.pending if j.job_id != job.job_id), job)
    with_job = dataclasses.replace(snapshot, pending=pending)
    decisions = decide(with_job, model, config, state=state, forecasts=True)
    now = snapshot.now
    waiting = next((w for w in decisions.waiting if w.job_id == job.job_id), None)
    if waiting is not None and waiting.never_fits:
        return SubmissionCheck(job.job_id, waiting.line, never_fits=True, refuse=True)
    f = decisions.forecasts.get(job.job_id)
    if f is None or f.end_p50 == float("inf"):
        line = waiting.line if waiting is not None else "waiting: no forecast"
        return SubmissionCheck(job.job_id, line, forecast=f)
    when = (
        f"starts now, ends in {about(f.end_p50 - now)} (p50), {about(f.end_p90 - now)} (p90)"
        if f.start_p50 <= now
        else f"starts in {about(f.start_p50 - now)}, ends in {about(f.end_p50 - now)} (p50),"
        f" {about(f.end_p90 - now)} (p90)"
    )
    if job.deadline is None:
        return SubmissionCheck(job.job_id, when, forecast=f)
    if f.end_p50 <= job.deadline:
        return SubmissionCheck(job.job_id, when, forecast=f, deadline_met=True)
    late = f.end_p50 - job.deadline
    refuse = job.deadline_action == "refuse"
    action = "refused" if refuse else "queued with a warning"
    line = f"deadline cannot be met: predicted end {about(late)} after it ({when}); {action}"
    return SubmissionCheck(job.job_id, line, forecast=f, deadline_met=False, refuse=refuse)
