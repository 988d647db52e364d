"""Teams in the policy: quotas with borrowing and reclaim (Kueue's cohorts), and fair share by
decayed past usage (Slurm's), as plain typed input. The signed policy record that names teams
and quotas is turned into these by whoever builds the snapshot; the policy does not read it.

- **Quotas** (:class:`TeamQuota`): GPUs guaranteed and a maximum, on devices of one model or on
  any. A team may borrow idle GPUs beyond its guarantee up to its maximum; a job that would take
  its team past a maximum waits. A team below its guarantee with a job that fits nowhere takes
  GPUs back: it preempts preemptible jobs of teams above their guarantee (the borrowers), the
  cheapest first, whatever their priority and however briefly they ran, but never more of a
  team than it holds beyond its guarantee (so a reclaim never sets off another); as a last
  resort, when what a team borrowed is part of a larger job, it may leave that team below its
  guarantee by less than the team reclaiming is below its own.
- **Fair share** (:class:`FairShare`): GPU-seconds weighted by the device's speed (reference
  seconds), halved every ``half_life_s``, per team and per user within a team. Among jobs of one
  priority and deadline, the team that used least for its share goes first, and within a team
  the user that used least (:func:`fair_key`).

No master: every owner counts a team's GPUs from the running jobs it sees (its snapshot) plus
the starts of its own pass (:class:`Ledger`), so two owners deciding at once from views one
gossip delay old may each start a job that fits under the maximum alone and overshoot it
together. The docs' scheduling page gives the bound and ``bench.sched --teams`` measures it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.policy.snapshot import Job, Running


@dataclass(frozen=True, slots=True)
class TeamQuota:
    """One team's promise on devices of ``model`` (``None``: any device)."""

    team: str
    guaranteed_gpus: float = 0.0
    max_gpus: float | None = None
    """``None``: no maximum (it may borrow every idle GPU)."""
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Teams:
    """What the policy is told of teams: their quotas and their decayed usage."""

    quotas: tuple[TeamQuota, ...] = ()
    usage_ref_s: Mapping[str, float] = field(default_factory=dict)
    """Decayed usage in reference GPU-seconds, by team and by ``team/user``."""
    starting_gpus: Mapping[str, float] = field(default_factory=dict)
    """GPUs of each team's starts in flight (offered, waiting for their victims to stop): held
    as the team's already, so a reclaim is not asked for twice."""

    def share(self, team: str) -> float:
        """A team's fair share: the GPUs it is guaranteed (on any model), at least 1."""
        return max(1.0, sum(q.guaranteed_gpus for q in self.quotas if q.team == team))

    def quotas_of(self, team: str) -> tuple[TeamQuota, ...]:
        return tuple(q for q in self.quotas if q.team == team)


def fair_key(job: Job, teams: Teams | None) -> tuple[float, float]:
    """The job's place by fair share: its team's usage for its share, then its user's."""
    if teams is None or not job.team:
        return (0.0, 0.0)
    usage = teams.usage_ref_s
    return (
        usage.get(job.team, 0.0) / teams.share(job.team),
        usage.get(f"{job.team}/{job.user}", 0.0),
    )


def _gpus(job: Job) -> float:
    return 1.0 if job.is_share else float(max(job.gpus, 0))


class Ledger:
    """GPUs each team holds during one pass: its running jobs, then this pass's starts."""

    def __init__(self, teams: Teams | None, running: Iterable[Running]) -> None:
        self.teams = teams
        self.held: dict[tuple[str, str | None], float] = {}
        if teams is None or not teams.quotas:
            return
        for r in running:
            if r.job.team:
                self.add(r.job, r.device_model)
        for team, gpus in teams.starting_gpus.items():
            self.held[(team, None)] = self.held.get((team, None), 0.0) + gpus

    @property
    def active(self) -> bool:
        return self.teams is not None and bool(self.teams.quotas)

    def add(self, job: Job, model: str) -> None:
        gpus = _gpus(job)
        for key in ((job.team, None), (job.team, model)):
            self.held[key] = self.held.get(key, 0.0) + gpus

    def remove(self, job: Job, model: str) -> None:
        gpus = _gpus(job)
        for key in ((job.team, None), (job.team, model)):
            self.held[key] = self.held.get(key, 0.0) - gpus

    def in_use(self, team: str, model: str | None) -> float:
        return self.held.get((team, model), 0.0)

    def over_max(self, job: Job, model: str | None) -> TeamQuota | None:
        """The maximum ``job`` would take its team past on ``model`` (``None``: before it is
        placed, the quotas on any device only)."""
        if self.teams is None or not job.team:
            return None
        gpus = _gpus(job)
        for q in self.teams.quotas_of(job.team):
            if q.max_gpus is None or (q.model is not None and q.model != model):
                continue
            if self.in_use(q.team, q.model) + gpus > q.max_gpus + 1e-9:
                return q
        return None

    def over_max_line(self, job: Job, q: TeamQuota) -> str:
        """Why ``job`` waits for its team's maximum ``q``, with what the team holds."""
        on = f" of {q.model}" if q.model else ""
        return (
            f"waiting: team {q.team} would pass its maximum of {q.max_gpus or 0:g} GPUs{on} "
            f"({self.in_use(q.team, q.model):g} in use, this job asks {_gpus(job):g})"
        )

    def below_guarantee(self, job: Job) -> bool:
        """Whether ``job`` fits within what its team is guaranteed (on any device)."""
        if self.teams is None or not job.team:
            return False
        gpus = _gpus(job)
        return any(
            self.in_use(q.team, q.model) + gpus <= q.guaranteed_gpus + 1e-9
            for q in self.teams.quotas_of(job.team)
            if q.model is None
        )

    def borrowed(self, team: str) -> float:
        """GPUs ``team`` holds beyond its guarantee (a team with no quota: all it holds)."""
        if self.teams is None:
            return 0.0
        quotas = [q for q in self.teams.quotas_of(team) if q.model is None]
        held = self.in_use(team, None)
        if not quotas:
            return held
        return max(0.0, held - max(q.guaranteed_gpus for q in quotas))

    def short_of(self, team: str) -> float:
        """GPUs ``team`` holds below its guarantee (on any device); 0 if none."""
        if self.teams is None:
            return 0.0
        quotas = [q.guaranteed_gpus for q in self.teams.quotas_of(team) if q.model is None]
        return max(0.0, max(quotas) - self.in_use(team, None)) if quotas else 0.0

    def reclaimable(
        self, victims: Iterable[Running], team: str | None = None, *, straddle: float = 0.0
    ) -> bool:
        """Whether stopping ``victims`` leaves each of their teams at or above its guarantee:
        a reclaim takes back only what was borrowed, so it never sets off another. Victims of
        ``team`` itself (a team preempting its own jobs) always may be. ``straddle`` > 0: a
        team that borrows may be left below its guarantee, by less than ``straddle``."""
        taken: dict[str, float] = {}
        for r in victims:
            if team is None or r.job.team != team:
                taken[r.job.team] = taken.get(r.job.team, 0.0) + _gpus(r.job)
        for t, gpus in taken.items():
            borrowed = self.borrowed(t)
            if straddle > 0:
                if borrowed <= 0 or gpus >= borrowed + straddle - 1e-9:
                    return False
            elif gpus > borrowed + 1e-9:
                return False
        return True


class FairShare:
    """Decayed usage by team and by ``team/user``: each GPU-second weighted by the device's
    speed, halved every ``half_life_s`` (Slurm's ``PriorityDecayHalfLife``, 7 days by default).
    Pure: the caller says when."""

    def __init__(self, half_life_s: float = 7 * 86_400.0) -> None:
        self.half_life_s = half_life_s
        self._value: dict[str, float] = {}
        self._at = 0.0

    def _decay_to(self, now: float) -> None:
        if now <= self._at:
            return
        factor = math.pow(0.5, (now - self._at) / self.half_life_s)
        for key in self._value:
            self._value[key] *= factor
        self._at = now

    def add(self, team: str, user: str, ref_gpu_s: float, now: float) -> None:
        """Usage that ended at ``now`` (reference GPU-seconds)."""
        self.add_many({(team, user): ref_gpu_s}, now)

    def add_many(self, amounts: Mapping[tuple[str, str], float], now: float) -> None:
        """Usage by ``(team, user)`` that ended at ``now`` (reference GPU-seconds)."""
        self._decay_to(now)
        for (team, user), ref_gpu_s in amounts.items():
            if not team or ref_gpu_s <= 0:
                continue
            for key in (team, f"{team}/{user}"):
                self._value[key] = self._value.get(key, 0.0) + ref_gpu_s

    def usage(self, now: float, running: Mapping[str, float] | None = None) -> dict[str, float]:
        """Decayed usage at ``now``, plus ``running`` (usage of running jobs so far, by key)."""
        self._decay_to(now)
        out = dict(self._value)
        for key, value in (running or {}).items():
            out[key] = out.get(key, 0.0) + value
        return out
