"""Defragmentation by moving: room for a job that needs several GPUs of one node, made by moving
small jobs off one node onto devices that stand idle elsewhere.

A job of ``k`` GPUs per node can wait for ever while the fleet has far more than ``k`` idle GPUs,
scattered a few per node, each node's others held by 1- and 2-GPU jobs (Borg and Kubernetes's
descheduler defragment for the same reason). When such a job cannot start, be it by placement or
by preemption, the policy looks for the node where the fewest GPU-seconds of work are lost to
make room: its idle devices the job may use, plus those of movable jobs (:func:`movable`: single
node, whole GPUs, not inference, past ``min_run_s``) that each fit on idle devices of *other*
nodes. Those jobs move (a migration: checkpoint signal, restart there), and the node is held for
the waiting job (the pass's reservation), so neither the queue's backfill nor moves to idle
capacity take it meanwhile. A plan is made for one job a pass, and not again for that job while
its last plan's moves may still be under way (``PolicyConfig.defrag_hold_s``).
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.policy import apply
from agent.policy.context import Context
from agent.policy.filters import host_room
from agent.policy.moves import Move, movable
from agent.policy.place import rank
from agent.policy.preempt import devices_if_freed, fitting_keys, lost_gpu_s
from agent.policy.snapshot import Job, Running


@dataclass(frozen=True, slots=True)
class Defrag:
    """Move these jobs so that ``job_id`` fits on ``node_id``."""

    job_id: str
    node_id: str
    moves: tuple[Move, ...]
    lost_gpu_s: float


def wants_defrag(job: Job) -> bool:
    """A job that needs several whole GPUs of one node (a gang's members each do)."""
    return job.gpus_per_node >= 2 and not job.is_share and not job.is_elastic


def _room_elsewhere(
    victims: list[Running], node_id: str, ctx: Context, exclude: frozenset[str]
) -> list[Move] | None:
    """A place on idle devices of another node for each of ``victims`` (taken in the index as
    found, given back if one has none), or ``None``."""
    placed: list[tuple[Running, Move]] = []
    for r in victims:
        cands = rank(r.job, ctx, limit=1, exclude=exclude | {node_id})
        if not cands:
            for done_r, move in placed:
                apply.release(ctx.index, done_r.job, move.placement)
            return None
        c = cands[0]
        apply.take(ctx.index, r.job, c.placement)
        placed.append((r, Move(r.job.job_id, c.placement, 0.0, c.model)))
    return [m for _, m in placed]


def _victims_on(
    job: Job, node_id: str, runs: dict[str, Running], ctx: Context, busy: set[str]
) -> tuple[float, list[Running]] | None:
    """The cheapest movable jobs on ``node_id`` whose devices, with its idle ones, fit ``job``,
    and whose CPU and host memory, with the node's free ones, do too."""
    entry = ctx.index.entries.get(node_id)
    if entry is None:
        return None
    node = entry.node
    ok = fitting_keys(job, node, ctx)
    if ok is None:
        return None
    now = ctx.snapshot.now
    eligible = sorted(
        (
            r
            for r in runs.values()
            if r.job.job_id not in busy
            and movable(r, ctx)
            and not r.placement.share_mem_bytes
            and r.job.gpus_per_node < job.gpus_per_node
        ),
        key=lambda r: (r.job.gpus_per_node, lost_gpu_s(r, now), r.job.job_id),
    )
    freed: set[str] = set()
    chosen: list[Running] = []
    for r in eligible:
        keys = r.placement.devices[0]
        if not set(keys) & ok:
            continue
        chosen.append(r)
        freed.update(keys)
        if devices_if_freed(job, node, freed, {}, ok) is not None and host_room(
            job, node, [v.job for v in chosen]
        ):
            return sum(lost_gpu_s(v, now) for v in chosen), chosen
    return None


def defrag_for(
    job: Job,
    ctx: Context,
    by_node: dict[str, dict[str, Running]],
    busy: set[str],
    reserved: frozenset[str] = frozenset(),
) -> Defrag | None:
    """The cheapest set of moves that makes room for ``job`` on one node, applied to the index
    (the moved jobs hold their new devices, their old ones are free), or ``None``."""
    if not wants_defrag(job) or not ctx.config.moves or ctx.config.defrag_max_moves <= 0:
        return None
    options: list[tuple[float, int, str, list[Running]]] = []
    for node_id, runs in by_node.items():
        if node_id in reserved:
            continue
        found = _victims_on(job, node_id, runs, ctx, busy)
        if found is not None and 0 < len(found[1]) <= ctx.config.defrag_max_moves:
            options.append((found[0], len(found[1]), node_id, found[1]))
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    for lost, _n, node_id, victims in options[:4]:
        moves = _room_elsewhere(victims, node_id, ctx, reserved)
        if moves is None:
            continue
        for r in victims:
            apply.release(ctx.index, r.job, r.placement)
            busy.add(r.job.job_id)
        return Defrag(job.job_id, node_id, tuple(moves), lost)
    return None
