"""Jobs their team is owed, placed in the pass that stops them or leaves them waiting.

With team quotas, a job of a team may take the GPUs of another of the team's own jobs by time
slicing. The job it stops then waits, and once stopped it is often owed its GPUs back: the
team holds less than it is guaranteed, because the pass gave the rest of what it freed to
others (a 1-GPU job taking an 8-GPU job's node), or because other jobs of the team stopped in
the same pass. Placed only once it has stopped, that job waits a second grace period: its own
stop, then the stop of whatever it reclaims. Here it is placed in the pass that stops it (or in
any pass while it stops), its start waiting for its own stop and for the jobs stopping where it
goes, which all stop at once: it runs again one grace period later, not two. Jobs of the team
that the pass left waiting before it fell below its guarantee are looked at again the same way.

Pure and bounded: each job is looked at once a pass, and at most ``PolicyConfig.preempt_tries``
of them look for a reclaim.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from agent.policy import apply
from agent.policy.context import Context
from agent.policy.place import Candidate, rank
from agent.policy.preempt import Preemption, attained_gpu_s
from agent.policy.snapshot import Job, Running
from agent.policy.state import PolicyState
from agent.policy.teams import Ledger
from agent.policy.victims import model_at, reclaim


@dataclass(frozen=True, slots=True)
class Restart:
    """Start ``job`` on ``cand`` once the jobs of ``after`` (it too, if it is stopping) have
    stopped."""

    job: Job
    cand: Candidate
    after: tuple[str, ...]


def served(r: Running, now: float) -> Job:
    """A running job as it is queued again once stopped: with the service it has had."""
    return replace(r.job, attained_gpu_s=attained_gpu_s(r, now))


def restart_owed(
    displaced: list[Job],
    ctx: Context,
    state: PolicyState,
    busy: set[str],
    ledger: Ledger,
    stopping: apply.Stopping,
    preemptions: list[Preemption],
) -> list[Restart]:
    """Place the jobs of ``displaced`` (stopping: the pass's victims, and jobs stopping since an
    earlier pass) that their team is owed: on idle GPUs (among them those the pass frees beyond
    what its starts take), else on GPUs a reclaim of borrowed ones frees (its preemption joins
    ``preemptions``, its victims join ``displaced``). Those placed leave ``displaced``."""
    out: list[Restart] = []
    tries = ctx.config.preempt_tries
    seen: set[str] = set()
    while True:
        job = next((j for j in displaced if j.job_id not in seen), None)
        if job is None:
            return out
        seen.add(job.job_id)
        if not ledger.below_guarantee(job):
            continue
        cands = rank(job, ctx, limit=1) if ledger.over_max(job, None) is None else []
        if cands:
            cand = cands[0]
            apply.take(ctx.index, job, cand.placement)
            after = apply.waits_for(cand.placement, stopping)
        else:
            if tries <= 0:
                continue
            tries -= 1
            pre = reclaim(job, ctx, state, busy, ledger)
            if pre is None:
                continue
            preemptions.append(pre)
            for victim_id in pre.victims:
                victim = state.running.jobs[victim_id]
                ledger.remove(victim.job, victim.device_model)
                apply.stopping((victim,), stopping)
                displaced.append(victim.job)
            model = model_at(pre.placement, ctx)
            cand = Candidate(pre.placement, 0.0, (("preemption", 0.0),), 1.0, model)
            after = pre.victims
        ledger.add(job, cand.model)
        displaced.remove(job)
        out.append(Restart(job, cand, tuple(sorted({job.job_id, *after}))))


def revisit(
    held: list[tuple[Job, int]],
    team: str,
    ctx: Context,
    ledger: Ledger,
    stopping: apply.Stopping,
    revisited: set[str],
) -> list[Restart]:
    """Jobs of ``team`` the pass left waiting (``held``), now that a job of the team took
    others of its jobs' GPUs and left it below its guarantee: each is looked at again (once a
    pass) and starts on idle GPUs there are now; those placed leave ``held``."""
    out: list[Restart] = []
    for entry in list(held):
        job = entry[0]
        if job.team != team or job.job_id in revisited or not ledger.below_guarantee(job):
            continue
        revisited.add(job.job_id)
        cands = [c for c in rank(job, ctx, limit=1) if ledger.over_max(job, c.model) is None]
        if not cands:
            continue
        apply.take(ctx.index, job, cands[0].placement)
        ledger.add(job, cands[0].model)
        held.remove(entry)
        out.append(Restart(job, cands[0], apply.waits_for(cands[0].placement, stopping)))
    return out
