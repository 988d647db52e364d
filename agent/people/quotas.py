"""Team quotas and fair share on a live agent: the held team policy and the gossiped job records
turned into the pure policy's :class:`~agent.policy.teams.Teams`, and the runner's own check of
a start against its team's maximum.

The policy room never reads wire types; this module is where the admin-signed policy record
(:class:`~agent.wire.policy.PolicyBody`) meets it. It is read by both sides of a start:

- the owner (``agent.owning``) gives its decision pass the quotas, each job's team and user
  (the team policy's entry for the key that signed the job's submission), and the decayed usage
  of each team and ``team/user`` (:func:`teams_now`);
- the runner (``agent.running.runner``) checks an offer against the team's maximum and, for a
  reclaim, its guarantee, as it sees the mesh itself (:func:`over_max`, :func:`reclaim_allows`):
  owners that decided at once from their own views are caught by whichever runner they offer
  to, which counts its own runs exactly.

**Usage for fair share comes from the view, not the usage rows.** Every agent already gossips
each job record with its attempts (node, start, end) and the signed submission (GPUs, signer),
so every owner computes the same decayed usage from what it holds, with no call to any agent
and nothing that stalls when one is slow. The per-node usage rows (``shoal usage``) are the
durable, per-day account; they live on each runner and would need a fan-out read per pass. What
the view cannot give: attempts of jobs whose records the mesh no longer gossips (jobs removed),
and a device-speed weight (GPU-seconds are counted as they are).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agent.policy.snapshot import Job, Running
from agent.policy.teams import TeamQuota, Teams
from agent.wire.policy import ANY_CLASS, PolicyBody

if TYPE_CHECKING:
    from agent.job.authority import Submission

HALF_LIFE_S = 7 * 86_400.0
"""Fair share's decay: usage halves every week (Slurm's ``PriorityDecayHalfLife`` default)."""

Who = tuple[str, str]
"""A job's team and user (empty strings: the policy names neither)."""


def quotas_of(body: PolicyBody) -> tuple[TeamQuota, ...]:
    """The policy's quotas as the pure policy takes them (class ``any``: every model)."""
    return tuple(
        TeamQuota(
            team.name,
            float(q.guaranteed_gpus),
            float(q.max_gpus),
            None if q.gpu_class == ANY_CLASS else q.gpu_class,
        )
        for team in body.teams
        for q in team.quotas
    )


def who_signed(body: PolicyBody | None, operator_id: str) -> Who:
    """The team and name of the person whose key signed a submission."""
    person = body.person_by_id(operator_id) if body is not None else None
    return (person.team, person.name) if person is not None else ("", "")


def tag(job: Job, who: Who) -> Job:
    """``job`` counted against ``who``'s team and user."""
    if (job.team, job.user) == who:
        return job
    return replace(job, team=who[0], user=who[1])


def tag_running(running: Iterable[Running], who: Mapping[str, Who]) -> tuple[Running, ...]:
    return tuple(
        replace(r, job=tag(r.job, who[r.job.job_id])) if r.job.job_id in who else r for r in running
    )


def submission_gpus(sub: Submission) -> float:
    """The GPUs a job's submission asks for over all its nodes (a share counts as one)."""
    r = sub.spec.resources
    if r.share_mem_bytes is not None or r.share_fraction is not None:
        return 1.0
    return float(max(r.gpus_per_node, 0) * max(r.nodes, 1))


def decayed_usage(
    jobs: Mapping[str, Mapping[str, Any]],
    who: Mapping[str, Who],
    submissions: Mapping[str, Submission],
    now: float,
    half_life_s: float = HALF_LIFE_S,
) -> dict[str, float]:
    """GPU-seconds by team and ``team/user``, each attempt's decayed by how long ago it ended
    (a running attempt counts up to ``now`` undecayed), from the job records' attempts."""
    out: dict[str, float] = {}
    for job_id, doc in jobs.items():
        team, user = who.get(job_id, ("", ""))
        sub = submissions.get(job_id)
        if not team or sub is None:
            continue
        gpus = submission_gpus(sub)
        seen: set[int] = set()
        for entry in doc.get("attempts") or ():
            if not isinstance(entry, Mapping):
                continue
            attempt, start = entry.get("attempt"), entry.get("started_at")
            end = entry.get("finished_at")
            if not isinstance(start, int | float) or attempt in seen:
                continue  # a gang's members share one attempt: count it once
            if isinstance(attempt, int):
                seen.add(attempt)
            end_s = float(end) if isinstance(end, int | float) else now
            gpu_s = max(0.0, end_s - float(start)) * gpus
            weight = math.pow(0.5, max(0.0, now - end_s) / half_life_s)
            for key in (team, f"{team}/{user}"):
                out[key] = out.get(key, 0.0) + gpu_s * weight
    return out


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


# -- the runner's check --------------------------------------------------------------------------


def held_by_team(
    running: Iterable[tuple[str, float, str]], who: Mapping[str, Who]
) -> dict[tuple[str, str | None], float]:
    """GPUs each team holds, on any model (``(team, None)``) and by model, from ``(job id,
    GPUs, device model)`` of the jobs that run."""
    held: dict[tuple[str, str | None], float] = {}
    for job_id, gpus, model in running:
        team = who.get(job_id, ("", ""))[0]
        if not team:
            continue
        for key in ((team, None), (team, model)):
            held[key] = held.get(key, 0.0) + gpus
    return held


def over_max(
    body: PolicyBody | None,
    team: str,
    gpus: float,
    model: str,
    held: Mapping[tuple[str, str | None], float],
) -> str | None:
    """The one-line reason a start of ``gpus`` on ``model`` would take ``team`` past one of
    its maximums as ``held`` counts it; ``None``: it would not."""
    if body is None or not team:
        return None
    for q in quotas_of(body):
        if q.team != team or q.max_gpus is None or (q.model is not None and q.model != model):
            continue
        now_gpus = held.get((team, q.model), 0.0)
        if now_gpus + gpus > q.max_gpus + 1e-9:
            on = f" of {q.model}" if q.model else ""
            return (
                f"team {team} is at its maximum of {q.max_gpus:g} GPUs{on} "
                f"({now_gpus:g} held as this agent sees the mesh)"
            )
    return None


def guaranteed(body: PolicyBody | None, team: str) -> float | None:
    """What ``team`` is guaranteed on any model (``None``: no quota on any model)."""
    if body is None or not team:
        return None
    found = [q.guaranteed_gpus for q in quotas_of(body) if q.team == team and q.model is None]
    return max(found) if found else None


def reclaim_allows(
    body: PolicyBody | None,
    team: str,
    gpus: float,
    victims: Mapping[str, tuple[str, float]],
    held: Mapping[tuple[str, str | None], float],
) -> str | None:
    """Whether a start of ``gpus`` for ``team`` may stop ``victims`` (job id -> (team, GPUs))
    whatever their priority: ``team`` stays within its guarantee, and no victim's team is left
    below its own (a reclaim takes back only what was borrowed). ``None``: it may; else why not."""
    mine = guaranteed(body, team)
    if mine is None:
        return f"team {team or '(none)'} has no guarantee to reclaim"
    if held.get((team, None), 0.0) + gpus > mine + 1e-9:
        return f"team {team} would hold more than its guarantee of {mine:g} GPUs"
    taken: dict[str, float] = {}
    for _v, (vteam, vgpus) in victims.items():
        if vteam == team:
            return "a reclaim stops no job of the reclaiming team"
        taken[vteam] = taken.get(vteam, 0.0) + vgpus
    for vteam, vgpus in taken.items():
        theirs = guaranteed(body, vteam) or 0.0
        borrowed = max(0.0, held.get((vteam, None), 0.0) - theirs)
        if vgpus > borrowed + 1e-9:
            return f"team {vteam or '(none)'} holds {borrowed:g} GPUs beyond its guarantee"
    return None
