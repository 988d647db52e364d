"""A job's team and the quotas it counts against, from the admin-signed team policy
(:class:`~agent.wire.policy.PolicyBody`) and the gossiped job records: what both sides of a
start read (the owner's side turns it into the pure policy's teams: ``agent.owning.teamquotas``).

- the owner (``agent.owning``) gives its decision pass the quotas, each job's team and user
  (the team policy's entry for the key that signed the job's submission), and the decayed usage
  of each team and ``team/user`` (:func:`decayed_usage`);
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
from typing import TYPE_CHECKING, Any

from agent.wire.policy import ANY_CLASS, PolicyBody

if TYPE_CHECKING:
    from agent.job.authority import Submission

HALF_LIFE_S = 7 * 86_400.0
"""Fair share's decay: usage halves every week (Slurm's ``PriorityDecayHalfLife`` default)."""

Who = tuple[str, str]
"""A job's team and user (empty strings: the policy names neither)."""


def who_signed(body: PolicyBody | None, operator_id: str) -> Who:
    """The team and name of the person whose key signed a submission."""
    person = body.person_by_id(operator_id) if body is not None else None
    return (person.team, person.name) if person is not None else ("", "")


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


QuotaRow = tuple[str, float, float, str | None]
"""One quota: team, GPUs guaranteed, the most it may hold, the model (``None``: any)."""


def quota_rows(body: PolicyBody) -> tuple[QuotaRow, ...]:
    """The policy's quotas, class ``any`` as ``None`` (every model)."""
    return tuple(
        (
            team.name,
            float(q.guaranteed_gpus),
            float(q.max_gpus),
            None if q.gpu_class == ANY_CLASS else q.gpu_class,
        )
        for team in body.teams
        for q in team.quotas
    )


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
    for qteam, _guaranteed, max_gpus, qmodel in quota_rows(body):
        if qteam != team or (qmodel is not None and qmodel != model):
            continue
        now_gpus = held.get((team, qmodel), 0.0)
        if now_gpus + gpus > max_gpus + 1e-9:
            on = f" of {qmodel}" if qmodel else ""
            return (
                f"team {team} would pass its maximum of {max_gpus:g} GPUs{on} "
                f"({now_gpus:g} held as this agent sees the mesh, this job asks {gpus:g})"
            )
    return None


def guaranteed(body: PolicyBody | None, team: str) -> float | None:
    """What ``team`` is guaranteed on any model (``None``: no quota on any model)."""
    if body is None or not team:
        return None
    found = [g for t, g, _m, model in quota_rows(body) if t == team and model is None]
    return max(found) if found else None


def owed_allows(
    body: PolicyBody | None, team: str, gpus: float, held: Mapping[tuple[str, str | None], float]
) -> str | None:
    """Whether a start of ``gpus`` for ``team`` is owed its guarantee: the team has one and
    stays within it. ``None``: it is; else why not."""
    mine = guaranteed(body, team)
    if mine is None:
        return f"team {team or '(none)'} has no guarantee to reclaim"
    if held.get((team, None), 0.0) + gpus > mine + 1e-9:
        return f"team {team} would hold more than its guarantee of {mine:g} GPUs"
    return None


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
    why = owed_allows(body, team, gpus, held)
    if why is not None:
        return why
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
