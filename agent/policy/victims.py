"""Preemption and reclaim inside one decision pass: who a job waiting for room may stop, given
what the pass has already decided (``busy``: jobs it stops or moves) and the teams' GPUs as the
pass counts them (:class:`agent.policy.teams.Ledger`). :mod:`agent.policy.decision` calls these;
:mod:`agent.policy.preempt` holds the rules and the search over one node.
"""

from __future__ import annotations

from agent.policy import apply
from agent.policy.context import Context
from agent.policy.preempt import Preemption, may_preempt, preempt_for
from agent.policy.queue import level
from agent.policy.snapshot import Job, Placement, Running
from agent.policy.state import PolicyState
from agent.policy.teams import Ledger


def preempt(
    job: Job, ctx: Context, state: PolicyState, busy: set[str], ledger: Ledger
) -> Preemption | None:
    """A preemption by priority or time slicing; with team quotas, never one that leaves
    another team below its guarantee (it would take the GPUs straight back), and none of the
    job's own team's jobs while a start of the team is in flight (:func:`_landing`)."""
    if not ctx.config.preemption or job.gpus_per_node == 0:
        return None
    if not _may_preempt_any(job, state, bool(ctx.config.time_slice)):
        return None
    levels = ctx.config.time_slice
    served = level(job.attained_gpu_s, levels) if levels and job.preemptible else -1
    memo = (job.priority, job.preemptible, served)
    held = ctx.eligible.get(memo)
    if held is None:  # who may be stopped depends on the job only through these three
        held = ctx.eligible[memo] = {}
        for node_id, runs in state.running.by_node.items():
            eligible = [r for r in runs.values() if may_preempt(job, r, ctx)]
            if eligible:
                held[node_id] = eligible
    by_node: dict[str, list[Running]] = {}
    teams = ledger.active
    landing = teams and _landing(job, ctx)
    for node_id, may in held.items():
        free = [
            r
            for r in may
            if r.job.job_id not in busy
            and (not teams or ledger.reclaimable((r,), job.team))
            and not (landing and r.job.team == job.team)
        ]
        if free:
            by_node[node_id] = free
    if not by_node:
        return None
    pre = preempt_for(job, ctx, by_node, checked=True)
    if teams and pre is not None:
        victims = (state.running.jobs[v] for v in pre.victims)
        if not ledger.reclaimable(victims, job.team):
            return None
    return take_over(job, pre, ctx, state, busy)


def _landing(job: Job, ctx: Context) -> bool:
    """Whether a start of ``job``'s team decided in an earlier pass still waits for its
    victims to stop: until it has, the team's jobs do not take one another's GPUs by time
    slicing (each such swap leaves the team a GPU short for a grace period, and swaps begun
    one after another, each before the last has landed, would keep it short for as long as
    they go on)."""
    teams = ctx.snapshot.teams
    return teams is not None and teams.starting_gpus.get(job.team, 0.0) > 0


def reclaim(
    job: Job,
    ctx: Context,
    state: PolicyState,
    busy: set[str],
    ledger: Ledger,
    *,
    straddle: bool = False,
) -> Preemption | None:
    """A team below its guarantee takes GPUs back: preemptible jobs of other teams that hold
    more than they are guaranteed (borrowers) may be stopped, whatever their priority and
    however briefly they ran, as long as no borrower is left below its own guarantee (so one
    reclaim never sets off another; :mod:`agent.policy.teams`).

    ``straddle`` (the last resort of a job owed its guarantee): what teams borrowed may be part
    of jobs larger than it (3 GPUs borrowed as part of a 4-GPU job), which no reclaim could take
    back, so the owed job would wait for jobs to end. Then a borrower may be left below its
    guarantee, by less than the job's team is below its own: the largest shortfall among the
    teams shrinks with each such reclaim, so they cannot go round in a loop."""
    if not ctx.config.preemption or job.gpus_per_node == 0:
        return None
    slack = ledger.short_of(job.team) if straddle else 0.0
    if straddle and slack <= 0:
        return None
    by_node: dict[str, list[Running]] = {}
    for node_id, runs in state.running.by_node.items():
        borrowed = [
            r
            for r in runs.values()
            if r.job.preemptible
            and r.job.job_id not in busy
            and r.job.team != job.team
            and ledger.reclaimable((r,), straddle=slack)
        ]
        if borrowed:
            by_node[node_id] = borrowed
    if not by_node:
        return None
    pre = preempt_for(job, ctx, by_node, checked=True)
    victims = [state.running.jobs[v] for v in pre.victims] if pre is not None else []
    if pre is None or not ledger.reclaimable(victims, straddle=slack):
        return None
    return take_over(job, pre, ctx, state, busy)


def take_over(
    job: Job, pre: Preemption | None, ctx: Context, state: PolicyState, busy: set[str]
) -> Preemption | None:
    """Free a preemption's victims in the index and give their devices to ``job``."""
    if pre is None:
        return None
    for victim_id in pre.victims:
        victim = state.running.jobs[victim_id]
        apply.release(ctx.index, victim.job, victim.placement)
        busy.add(victim_id)
    apply.take(ctx.index, job, pre.placement)
    return pre


def _may_preempt_any(job: Job, state: PolicyState, slicing: bool) -> bool:
    if slicing and job.preemptible:
        return any(p <= job.priority for p in state.running.preemptible)
    return any(p < job.priority for p in state.running.preemptible)


def model_at(placement: Placement, ctx: Context) -> str:
    """The device model of ``placement``'s first node's devices ("" if unknown)."""
    node = ctx.index.node(placement.node_id)
    if node is None:
        return ""
    keys = set(placement.devices[0])
    return next((d.model for d in node.devices if d.key in keys), "")
