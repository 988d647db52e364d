"""One decision pass: from a snapshot and ``now`` to every decision and every explanation.

1. The pending jobs in queue order (:mod:`agent.policy.queue`). Each takes its best candidate
   (:mod:`agent.policy.place`, :mod:`agent.policy.gangs`) if it has one; else a preemption if the
   rules allow one (:mod:`agent.policy.preempt`); else it waits, and the first job that waits gets
   a reservation that later jobs may only backfill around. With team quotas, jobs stopping that
   their team is owed are placed first, and a preemption's victims and the jobs left waiting that
   their team is owed once it is made are placed at once (:mod:`agent.policy.owed`).
2. The jobs starting in this pass are placed again in order of how much they care which device
   they get (the spread of their speeds over the fleet's models), so the job that gains most from
   a fast device gets it rather than whoever came first; if that leaves any of them without room,
   the first placement stands.
3. A starter on a fast device yields it to a running job that gains far more there, taking that
   job's devices instead (a swap); then running jobs move onto capacity still idle where they end
   sooner by enough (:mod:`agent.policy.moves`).
4. Every job left waiting gets its line (:mod:`agent.policy.explain`); with ``forecasts``, every
   pending and running job its predicted start and end (:mod:`agent.policy.forecast`).

Owners call this with the mesh's whole queue, so every owner sorts the same jobs the same way,
and act on the decisions about the jobs they own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from agent.policy import apply
from agent.policy.config import PolicyConfig
from agent.policy.context import Context, workload_shapes
from agent.policy.defrag import defrag_for, wants_defrag
from agent.policy.explain import behind_line, busy_line, never_reason
from agent.policy.forecast import Forecast, _Duration, _Timeline, forecast, remaining_s
from agent.policy.fragmentation import constrained
from agent.policy.gangs import rank_gang
from agent.policy.guarantee import Guarantee, guarantee_for, wants_guarantee
from agent.policy.index import Group
from agent.policy.model import ThroughputModel
from agent.policy.moves import Move, moves_to_idle, swap_for
from agent.policy.owed import restart_owed, revisit, served
from agent.policy.place import Candidate, kind_reason, rank, score_words, speed_spread
from agent.policy.preempt import Preemption
from agent.policy.queue import Reservation, queue_order
from agent.policy.snapshot import Job, Placement, Snapshot
from agent.policy.state import PolicyState
from agent.policy.teams import Ledger
from agent.policy.victims import model_at, preempt, reclaim


@dataclass(frozen=True, slots=True)
class Assignment:
    """Start ``job_id`` on ``placement`` now."""

    job_id: str
    placement: Placement
    model: str
    speed: float
    """Reference seconds of work per second there."""
    score: float
    terms: tuple[tuple[str, float], ...]
    alternates: tuple[Placement, ...] = ()
    """Where to offer it next, in turn, if the node declines."""
    backfilled: bool = False
    """It starts ahead of a job holding a reservation."""
    after: tuple[str, ...] = ()
    """Jobs that must stop (or move) first: preemption victims, or a swapped job."""

    def why(self) -> str:
        """The score's largest parts, for the operator: ``speed +0.69, fragmentation -0.12``."""
        return score_words(self.terms)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A job left waiting, and why, in one line."""

    job_id: str
    line: str
    never_fits: bool = False


@dataclass(frozen=True, slots=True)
class Decisions:
    """What one pass decided (see the module doc)."""

    now: float
    assignments: tuple[Assignment, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    moves: tuple[Move, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    forecasts: Mapping[str, Forecast] = field(default_factory=dict)

    def assignment(self, job_id: str) -> Assignment | None:
        return next((a for a in self.assignments if a.job_id == job_id), None)

    def waiting_line(self, job_id: str) -> str | None:
        return next((w.line for w in self.waiting if w.job_id == job_id), None)


@dataclass(slots=True)
class _Start:
    job: Job
    cand: Candidate
    alternates: tuple[Candidate, ...]
    backfilled: bool = False
    after: tuple[str, ...] = ()


def rank_any(
    job: Job, ctx: Context, *, limit: int | None = None, exclude: frozenset[str] = frozenset()
) -> list[Candidate]:
    """Candidates for a job of any shape: one node, a share, or a gang set."""
    if job.is_gang:
        return rank_gang(job, ctx, limit=limit, exclude=exclude)
    return rank(job, ctx, limit=limit, exclude=exclude)


def context(
    snapshot: Snapshot,
    model: ThroughputModel,
    config: PolicyConfig | None = None,
    *,
    state: PolicyState | None = None,
    owner: str | None = None,
) -> tuple[Context, PolicyState]:
    """A pass's context over ``snapshot`` (refreshing ``state`` from it)."""
    state = state or PolicyState()
    state.index.refresh(snapshot.nodes)
    state.running.refresh(snapshot.running)
    ctx = Context(snapshot, state.index, model, config or PolicyConfig(), owner)
    ctx.shapes = workload_shapes(snapshot, models=ctx.config.objective == "packing")
    ctx.frag_models = ctx.config.objective == "packing" and constrained(ctx.shapes)
    ctx.frag_vectors = state.frag_vectors.for_shapes(ctx.shapes)
    state.passes += 1
    if len(state.kind_ok) > 100_000:
        state.kind_ok.clear()
    if state.passes % 256 == 0:
        state.move_potential.clear()  # the model learns: look at speeds afresh now and then
    ctx.kind_ok = state.kind_ok
    if len(state.static_fits) > 200_000:
        state.static_fits.clear()
    ctx.static_fits = state.static_fits
    ctx.req_keys = state.req_keys
    ctx.interned = state.interned
    return ctx, state


def decide(
    snapshot: Snapshot,
    model: ThroughputModel,
    config: PolicyConfig | None = None,
    *,
    state: PolicyState | None = None,
    owner: str | None = None,
    forecasts: bool = False,
    explain: bool = True,
) -> Decisions:
    """Every decision for ``snapshot`` (see the module doc). Keep one ``state`` per decider
    across calls: it makes a pass cost what changed, not what exists. ``explain=False`` leaves
    out the lines of jobs that wait for busy capacity (a simulator has no one to tell)."""
    ctx, state = context(snapshot, model, config, state=state, owner=owner)
    cfg = ctx.config
    _keep_promises(state, snapshot, ctx)
    order = queue_order(snapshot.pending, cfg.time_slice, snapshot.teams)
    ledger = Ledger(snapshot.teams, snapshot.running)
    if ledger.active:  # within a priority, what teams are guaranteed before what they borrow
        order.sort(key=lambda j: (-j.priority, not ledger.below_guarantee(j)))
    busy: set[str] = set()
    stopping: apply.Stopping = {}
    owed_moves: list[Move] = []
    starts: list[_Start] = []
    preemptions: list[Preemption] = []
    displaced: list[Job] = list(snapshot.stopping) if ledger.active else []
    revisited: set[str] = set()
    waiting: list[Waiting] = []
    held: list[tuple[Job, int]] = []
    reservation: Reservation | None = None
    blocked = False
    now = snapshot.now
    idle = ctx.index.has_idle()
    lowest = min(state.running.preemptible, default=None)
    slicing = bool(cfg.time_slice)
    reserve_tried = False
    tries = owed_tries = 0
    held_for = _held_nodes(state, snapshot)
    if displaced:
        again = restart_owed(displaced, ctx, state, busy, ledger, stopping, preemptions)
        starts.extend(_Start(r.job, r.cand, (), after=r.after) for r in again)
    for i, job in enumerate(order):
        never = never_reason(job, ctx, state)
        if never is not None:
            waiting.append(Waiting(job.job_id, never, never_fits=True))
            continue
        quota = ledger.over_max(job, None) if ledger.active else None
        if quota is not None:
            waiting.append(Waiting(job.job_id, ledger.over_max_line(job, quota)))
            continue
        reclaims = ledger.active and ledger.below_guarantee(job)
        may_preempt = reclaims or (
            lowest is not None
            and (job.priority > lowest or (slicing and job.preemptible and job.priority >= lowest))
        )
        no_room = job.gpus_per_node > 0 and not idle and not may_preempt
        if blocked or no_room:
            held.append((job, i))
            continue
        cands = rank_any(job, ctx, exclude=_held_from(job, held_for))
        if ledger.active and job.team:
            cands = [c for c in cands if ledger.over_max(job, c.model) is None]
        backfilled = False
        if reservation is not None and cands:
            cands = [
                c
                for c in cands
                if reservation.allows(c.placement.node_ids, now + ctx.duration_s(job, c.speed)[1])
            ]
            backfilled = True
        if cands:
            best = cands[0]
            apply.take(ctx.index, job, best.placement)
            after = apply.waits_for(best.placement, stopping)
            starts.append(_Start(job, best, tuple(cands[1:]), backfilled, after))
            ledger.add(job, best.model)
            idle = ctx.index.has_idle()
            continue
        pre = reclaim(job, ctx, state, busy, ledger) if reclaims else None
        if pre is None and reclaims and wants_guarantee(job) and owed_tries < cfg.preempt_tries:
            owed_tries += 1
            exclude = _held_from(job, held_for)
            plan = guarantee_for(job, ctx, state.running, busy, ledger, exclude)
            if plan is not None:
                starts.append(_owed(job, plan, ctx, state, ledger, stopping, preemptions))
                owed_moves.extend(plan.moves)
                continue
        if pre is None and reclaims:
            pre = reclaim(job, ctx, state, busy, ledger, straddle=True)
        if pre is None and tries < cfg.preempt_tries:
            tries += 1
            pre = preempt(job, ctx, state, busy, ledger)
        if pre is not None:
            preemptions.append(pre)
            for victim_id in pre.victims:
                victim = state.running.jobs[victim_id]
                ledger.remove(victim.job, victim.device_model)
                apply.stopping((victim,), stopping)
            on = model_at(pre.placement, ctx)
            ledger.add(job, on)
            cand = Candidate(pre.placement, 0.0, (("preemption", 0.0),), 1.0, on)
            starts.append(_Start(job, cand, (), after=pre.victims))
            if ledger.active:  # the victims, and jobs left waiting, its team is owed now
                displaced.extend(served(state.running.jobs[v], now) for v in pre.victims)
                again = restart_owed(displaced, ctx, state, busy, ledger, stopping, preemptions)
                again += revisit(held, job.team, ctx, ledger, stopping, revisited)
                starts.extend(_Start(r.job, r.cand, (), after=r.after) for r in again)
            continue
        held.append((job, i))
        if not cfg.backfill:
            blocked = True
        elif not reserve_tried and idle:
            reserve_tried = True
            reservation = _reserve(job, ctx, state, starts)
    starts = _by_gain(starts, ctx, reservation)
    for s in starts:
        if not s.after:  # placed again: on devices a victim of this pass still holds, it waits
            s.after = apply.waits_for(s.cand.placement, stopping)
    moves: list[Move] = owed_moves
    for s in starts:
        if s.after or s.job.is_gang:
            continue
        swapped = swap_for(s.job, s.cand, ctx, state.running.groups, busy)
        if swapped is None:
            continue
        move, moved = swapped
        apply.release(ctx.index, s.job, s.cand.placement)
        apply.release(ctx.index, moved.job, moved.placement)
        apply.take(ctx.index, moved.job, s.cand.placement)
        apply.take(ctx.index, s.job, moved.placement)
        speed = ctx.model.relative(
            s.job.job_class, s.job.kind, moved.device_model, s.job.gpus_per_node
        )
        s.cand = Candidate(moved.placement, s.cand.score, s.cand.terms, speed, moved.device_model)
        s.alternates = ()
        s.after = (moved.job.job_id,)
        moves.append(move)
    if ctx.index.has_idle():
        reserved = frozenset(reservation.node_ids) if reservation is not None else frozenset()
        reserved |= frozenset(held_for)
        owed = [(job, i) for job, i in held if ledger.active and ledger.below_guarantee(job)]
        moves.extend(_defrag(owed, ctx, state, busy, reserved))
        reserved |= frozenset(node_id for node_id, _ in state.defrag.values())
        moves.extend(moves_to_idle(ctx, state.running.groups, busy, reserved, state.move_potential))
    if stopping:
        moves = [replace(m, after=apply.waits_for(m.placement, stopping)) for m in moves]
    for s in starts:
        if s.after:
            state.promised[s.job.job_id] = (s.cand.placement, now, now + cfg.defrag_hold_s)
    for m in moves:
        if m.after:
            state.promised[m.job_id] = (m.placement, now, now + cfg.defrag_hold_s)
    fc: dict[str, Forecast] = {}
    if forecasts:
        started = [(s.job, s.cand.model, now) for s in starts]
        fc = forecast(ctx, order, started)
    if explain:
        waiting.extend(_explain(held, reservation, fc, ctx))
    return Decisions(
        now,
        tuple(
            Assignment(
                s.job.job_id,
                s.cand.placement,
                s.cand.model,
                s.cand.speed,
                s.cand.score,
                s.cand.terms,
                tuple(c.placement for c in s.alternates),
                s.backfilled,
                s.after,
            )
            for s in starts
        ),
        tuple(preemptions),
        tuple(moves),
        (reservation,) if reservation is not None else (),
        tuple(waiting),
        fc,
    )


def _held_nodes(state: PolicyState, snapshot: Snapshot) -> dict[str, str]:
    """Nodes being emptied for a waiting job (:mod:`agent.policy.defrag`), by node: the job's id.
    A plan ends when its job no longer waits or its hold ran out."""
    if not state.defrag:
        return {}
    waiting = {j.job_id for j in snapshot.pending}
    for job_id, (_node, until) in list(state.defrag.items()):
        if job_id not in waiting or until <= snapshot.now:
            del state.defrag[job_id]
    return {node_id: job_id for job_id, (node_id, _) in state.defrag.items()}


def _keep_promises(state: PolicyState, snapshot: Snapshot, ctx: Context) -> None:
    """Index the idle devices promised to starts in flight as theirs (:attr:`PolicyState.promised`);
    a promise ends when its hold does, when its job runs elsewhere, or once the nodes' records
    show it running there (the job's own record may say it started before its node's does)."""
    if not state.promised:
        return
    waiting = {j.job_id for j in snapshot.pending}
    for job_id, (placement, made_at, until) in list(state.promised.items()):
        r = state.running.jobs.get(job_id)
        there = r is not None and r.placement == placement
        if (
            until <= snapshot.now
            or (r is not None and not there and r.started_at >= made_at)
            or (there and _shown(placement, ctx))
        ):
            del state.promised[job_id]
        elif job_id not in waiting:
            for node_id, keys in zip(placement.node_ids, placement.devices, strict=True):
                node = ctx.index.node(node_id)
                idle = [d.key for d in node.devices if d.key in keys and d.is_free] if node else []
                if idle:
                    stand_in = Job(job_id, gpus_per_node=len(idle))
                    apply.take(ctx.index, stand_in, Placement((node_id,), (tuple(idle),)))


def _shown(placement: Placement, ctx: Context) -> bool:
    """Whether no device of ``placement`` is idle in the nodes' records."""
    for node_id, keys in zip(placement.node_ids, placement.devices, strict=True):
        node = ctx.index.node(node_id)
        if node is not None and any(d.is_free for d in node.devices if d.key in keys):
            return False
    return True


def _held_from(job: Job, held_for: Mapping[str, str]) -> frozenset[str]:
    """The held nodes ``job`` may not take: those held for another job."""
    if not held_for:
        return frozenset()
    return frozenset(n for n, owner in held_for.items() if owner != job.job_id)


def _defrag(
    held: Sequence[tuple[Job, int]],
    ctx: Context,
    state: PolicyState,
    busy: set[str],
    reserved: frozenset[str],
) -> list[Move]:
    """Moves that empty a node for the first of ``held`` that needs several GPUs of one node and
    has no plan under way; the node is held for it from now on."""
    for job, _ in held:
        if not wants_defrag(job) or job.is_gang or job.job_id in state.defrag:
            continue
        plan = defrag_for(job, ctx, state.running.by_node, busy, reserved)
        if plan is None:
            continue
        state.defrag[job.job_id] = (plan.node_id, ctx.snapshot.now + ctx.config.defrag_hold_s)
        return list(plan.moves)
    return []


def _owed(
    job: Job,
    plan: Guarantee,
    ctx: Context,
    state: PolicyState,
    ledger: Ledger,
    stopping: apply.Stopping,
    preemptions: list[Preemption],
) -> _Start:
    """The start of a job owed its guarantee once ``plan``'s victims and moved jobs are off its
    node (:mod:`agent.policy.guarantee`); the pass counts them as gone from here on."""
    if plan.victims:
        preemptions.append(Preemption(job.job_id, plan.victims, plan.placement, plan.lost_gpu_s))
    for job_id in (*plan.victims, *(m.job_id for m in plan.moves)):
        r = state.running.jobs[job_id]
        apply.stopping((r,), stopping)
        if job_id in plan.victims:
            ledger.remove(r.job, r.device_model)
    model = model_at(plan.placement, ctx)
    ledger.add(job, model)
    cand = Candidate(plan.placement, 0.0, (("guarantee", 0.0),), 1.0, model)
    return _Start(job, cand, (), after=plan.after)


RESERVE_SCAN = 64
"""Nodes a reservation is looked for on: those with the most of the job's GPUs free already."""


def _reserve(
    job: Job, ctx: Context, state: PolicyState, starts: Sequence[_Start]
) -> Reservation | None:
    """The first blocked job's reservation: where and when it should start (p50), on the nodes
    that already have the most of what it needs free (they need the fewest jobs to end)."""
    now = ctx.snapshot.now
    key = ctx.key(job)
    ranked: list[tuple[int, int, Group]] = []
    for group in ctx.index.groups.values():
        free = sum(
            n for kind, n in group.whole_free.items() if kind_reason(job, key, kind, ctx) is None
        )
        if job.gpus_per_node == 0 or free or len(ranked) < RESERVE_SCAN:
            ranked.append((-free, group.serial, group))
    ranked.sort(key=lambda t: (t[0], t[1]))
    nodes: list[str] = []
    want = max(RESERVE_SCAN, 4 * job.nodes)
    for _free, _serial, group in ranked:
        for node_id in group.members:
            nodes.append(node_id)
            if len(nodes) >= want:
                break
        if len(nodes) >= want:
            break
    ends: dict[str, float] = {}
    for node_id in nodes:
        for job_id, r in state.running.by_node.get(node_id, {}).items():
            if job_id not in ends:
                ends[job_id] = now + remaining_s(r, ctx)[0]
    for s in starts:
        ends[s.job.job_id] = now + ctx.duration_s(s.job, s.cand.speed)[0]
    timeline = _Timeline(ctx, ends)
    placed = timeline.place(job, _Duration(ctx, 0), nodes)
    if placed is None:
        return None
    start, _end, chosen = placed
    return Reservation(job.job_id, chosen, start)


def _by_gain(starts: list[_Start], ctx: Context, reservation: Reservation | None) -> list[_Start]:
    """Place this pass's plain starters again, those that care most which device first."""
    plain = [s for s in starts if not s.after and not s.job.is_gang]
    if len(plain) < 2 or len(plain) > ctx.config.batch_limit:
        return starts
    spreads = {s.job.job_id: speed_spread(s.job, ctx) for s in plain}
    if max(spreads.values()) - min(spreads.values()) < 0.05:
        return starts
    for s in plain:
        apply.release(ctx.index, s.job, s.cand.placement)
    ordered = sorted(plain, key=lambda s: -spreads[s.job.job_id])  # stable: queue order on ties
    now = ctx.snapshot.now
    again: list[tuple[_Start, Candidate, tuple[Candidate, ...]]] = []
    for s in ordered:
        cands = rank(s.job, ctx)
        if reservation is not None and s.backfilled:
            cands = [
                c
                for c in cands
                if reservation.allows(c.placement.node_ids, now + ctx.duration_s(s.job, c.speed)[1])
            ]
        if not cands:
            for _s, c, _alts in again:
                apply.release(ctx.index, _s.job, c.placement)
            for first in plain:
                apply.take(ctx.index, first.job, first.cand.placement)
            return starts
        apply.take(ctx.index, s.job, cands[0].placement)
        again.append((s, cands[0], tuple(cands[1:])))
    for s, cand, alts in again:
        s.cand, s.alternates = cand, alts
    return starts


def _explain(
    held: Sequence[tuple[Job, int]],
    reservation: Reservation | None,
    fc: Mapping[str, Forecast],
    ctx: Context,
) -> list[Waiting]:
    now = ctx.snapshot.now
    out: list[Waiting] = []
    for job, ahead in held:
        f = fc.get(job.job_id)
        if reservation is not None and job.job_id == reservation.job_id:
            line = busy_line(job, ahead, reservation.node_ids[0], reservation.start_at - now)
        elif f is not None and f.node_id is not None and f.start_p50 < float("inf"):
            line = busy_line(job, ahead, f.node_id, f.start_p50 - now)
        elif reservation is not None and rank_any(job, ctx, limit=1):
            line = behind_line(job, reservation.job_id, reservation.start_at - now)
        else:
            line = busy_line(job, ahead, None, None)
        out.append(Waiting(job.job_id, line))
    return out
