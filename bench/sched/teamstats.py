"""Teams in the simulated mesh (``python -m bench.sched --teams N``): the usage the policy's fair
share reads, and the figures the benchmark's bars are about.

- ``team_guarantee_wait_s_max``: the longest a team had a pending job that fit within its
  guarantee (its GPUs held plus the job's at most what it is guaranteed) without it starting;
- ``jain_fairness``: Jain's index over the teams' GPU-seconds for their shares, counted only
  while every team has a job waiting (backlog); 1.0 is perfectly fair;
- ``quota_overshoot_gpus_max``: the most GPUs any team held above its maximum at any moment;
- ``quota_overshoot_s_max``: the longest a team stayed above its maximum.

Sampled at every event of the simulation (the state is constant between events).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

from agent.policy.prior import catalog_speed
from agent.policy.snapshot import Job, Running
from agent.policy.teams import FairShare, TeamQuota, Teams


@cache
def _speed(model: str) -> float:
    return catalog_speed(model, "training") or 1.0


def _gpus(job: Job) -> float:
    if job.share_fraction is None and job.share_mem_bytes is None:
        return float(job.gpus_per_node * job.nodes)
    if job.is_share:
        return job.share_fraction if job.share_fraction is not None else 1.0
    return float(job.gpus)


def equal_quotas(teams: int, total_gpus: int, max_factor: float = 2.0) -> tuple[TeamQuota, ...]:
    """``teams`` equal teams: each guaranteed its share of the GPUs, and a maximum of
    ``max_factor`` times it (twice, by default)."""
    share = total_gpus / teams
    cap = min(float(total_gpus), max_factor * share)
    return tuple(TeamQuota(team_name(k), guaranteed_gpus=share, max_gpus=cap) for k in range(teams))


def team_name(k: int) -> str:
    return f"team{k}"


class TeamBook:
    """Per-team usage and the bars' figures over one run."""

    def __init__(self, quotas: Sequence[TeamQuota], half_life_s: float = 7 * 86_400.0) -> None:
        self.quotas = tuple(quotas)
        self.teams = sorted({q.team for q in self.quotas})
        self.guarantee = {
            t: sum(q.guaranteed_gpus for q in self.quotas if q.team == t and q.model is None)
            for t in self.teams
        }
        self.maximum: dict[str, float | None] = {}
        for t in self.teams:
            caps = [q.max_gpus for q in self.quotas if q.team == t and q.model is None]
            self.maximum[t] = min((c for c in caps if c is not None), default=None)
        self.fair = FairShare(half_life_s)
        self.in_flight: dict[str, float] = {}
        self._at = 0.0
        self.unmet_since: dict[str, float] = {}
        self.wait_max_s = 0.0
        self.over_since: dict[str, float] = {}
        self.over_s_max = 0.0
        self.over_gpus_max = 0.0
        self.backlog_area: dict[str, float] = dict.fromkeys(self.teams, 0.0)
        self.backlog_s = 0.0

    def teams_now(self, now: float) -> Teams:
        return Teams(self.quotas, self.fair.usage(now), dict(self.in_flight))

    def starting(self, job: Job, sign: int) -> None:
        """A start of ``job`` held for its victims to stop (+1), or gone ahead (-1)."""
        if job.team:
            self.in_flight[job.team] = self.in_flight.get(job.team, 0.0) + sign * _gpus(job)

    def would_pass_max(self, job: Job, running: Iterable[Running]) -> bool:
        """Whether starting ``job`` now takes its team past its maximum (what a desk that
        counts every running job refuses)."""
        cap = self.maximum.get(job.team)
        if cap is None:
            return False
        held = sum(_gpus(r.job) for r in running if r.job.team == job.team)
        return held + _gpus(job) > cap + 1e-9

    def advance(self, now: float, running: Iterable[Running], pending: Iterable[Job]) -> None:
        """The state held since the last call ran until ``now``: account for it."""
        dt = now - self._at
        start = self._at
        self._at = max(self._at, now)
        held = dict.fromkeys(self.teams, 0.0)
        used: dict[tuple[str, str], float] = {}
        for r in running:
            job = r.job
            if job.team in held:
                gpus = _gpus(job)
                held[job.team] += gpus
                key = (job.team, job.user)
                used[key] = used.get(key, 0.0) + gpus * _speed(r.device_model)
        if dt > 0 and used:
            self.fair.add_many({k: v * dt for k, v in used.items()}, now)
        smallest: dict[str, float] = {}
        for job in pending:
            if job.team in held:
                g = _gpus(job)
                smallest[job.team] = min(smallest.get(job.team, g), g)
        for team in self.teams:
            small = smallest.get(team)
            unmet = small is not None and held[team] + small <= self.guarantee[team] + 1e-9
            self._interval(self.unmet_since, team, unmet, start, now, "wait")
            cap = self.maximum[team]
            over = 0.0 if cap is None else held[team] - cap
            if over > 1e-9:
                self.over_gpus_max = max(self.over_gpus_max, over)
            self._interval(self.over_since, team, over > 1e-9, start, now, "over")
        if dt > 0 and self.teams and all(t in smallest for t in self.teams):
            self.backlog_s += dt
            for team in self.teams:
                self.backlog_area[team] += held[team] * dt

    def _interval(
        self, since: dict[str, float], team: str, on: bool, start: float, now: float, what: str
    ) -> None:
        if on:
            since.setdefault(team, start)
            length = now - since[team]
        else:
            since.pop(team, None)  # it ended at ``start``: its length was counted then
            return
        if what == "wait":
            self.wait_max_s = max(self.wait_max_s, length)
        else:
            self.over_s_max = max(self.over_s_max, length)

    def jain(self) -> float | None:
        if self.backlog_s <= 0 or not self.teams:
            return None
        xs = [self.backlog_area[t] / max(self.guarantee[t], 1e-9) for t in self.teams]
        total = sum(xs)
        squares = sum(x * x for x in xs)
        return (total * total) / (len(xs) * squares) if squares > 0 else None

    def figures(self) -> dict[str, Any]:
        return {
            "teams": len(self.teams),
            "team_guarantee_wait_s_max": self.wait_max_s,
            "jain_fairness": self.jain(),
            "jain_backlog_s": self.backlog_s,
            "quota_overshoot_gpus_max": self.over_gpus_max,
            "quota_overshoot_s_max": self.over_s_max,
        }
