"""The held team policy and the view as the pure policy's :class:`~agent.policy.teams.Teams`, for
the owners' decision passes: the policy room never reads wire types, so they meet here
(the counts themselves: :mod:`agent.job.teamquota`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agent.job.teamquota import HALF_LIFE_S, Who, decayed_usage, quota_rows, who_signed
from agent.policy.snapshot import Job
from agent.policy.teams import TeamQuota, Teams
from agent.wire.policy import PolicyBody

if TYPE_CHECKING:
    from agent.job.authority import Submission


def quotas_of(body: PolicyBody) -> tuple[TeamQuota, ...]:
    """The policy's quotas as the pure policy takes them (class ``any``: every model)."""
    return tuple(TeamQuota(t, g, m, model) for t, g, m, model in quota_rows(body))


def tag(job: Job, who: Who) -> Job:
    """``job`` counted against ``who``'s team and user."""
    if (job.team, job.user) == who:
        return job
    return replace(job, team=who[0], user=who[1])


@dataclass(frozen=True, slots=True)
class TeamsNow:
    """What the held policy and the view say of teams now: the pure policy's input, and each
    job's team and user by job id."""

    teams: Teams
    who: Mapping[str, Who]

    def job(self, job: Job) -> Job:
        held = self.who.get(job.job_id)
        return tag(job, held) if held is not None else job


def teams_now(
    body: PolicyBody | None,
    jobs: Mapping[str, Mapping[str, Any]],
    submissions: Mapping[str, Submission],
    now: float,
    *,
    starting_gpus: Mapping[str, float] | None = None,
    half_life_s: float = HALF_LIFE_S,
) -> TeamsNow | None:
    """The teams of ``body`` over the view's ``jobs`` and ``submissions``; ``None`` when the
    policy gives no team a quota (nothing to enforce, nothing to share)."""
    if body is None:
        return None
    quotas = quotas_of(body)
    if not quotas:
        return None
    who = {job_id: who_signed(body, sub.operator_id) for job_id, sub in submissions.items()}
    usage = decayed_usage(jobs, who, submissions, now, half_life_s)
    return TeamsNow(Teams(quotas, usage, dict(starting_gpus or {})), who)
