"""Moves: a running job goes where it finishes sooner, when the fleet gains from it.

Two cases, both only for jobs past ``min_run_s`` since they started or last moved, single-node,
not shares and not inference services (those keep their place):

- *to idle capacity*: after the queue has taken what it can, a device left idle where a running
  job would finish sooner by at least ``move_min_gain_s`` and ``move_min_gain_fraction`` of its
  remaining time, the move's cost paid;
- *a swap*: a job this pass starts on a fast device yields it to a running job on a slower one
  whose speedup there is ``swap_ratio`` times its own, and takes that job's devices instead. The
  device goes to the job that gains most from it, whether it waits or already runs.

A move is carried out as a migration (checkpoint signal, restart on the new devices). Under the
``packing`` objective, where speed counts nothing, neither happens.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.policy import apply
from agent.policy.config import PolicyConfig
from agent.policy.context import Context
from agent.policy.filters import device_reason, host_room, node_reason
from agent.policy.forecast import remaining_s
from agent.policy.index import DeviceKind, kind_of
from agent.policy.place import Candidate, kind_reason, rank
from agent.policy.snapshot import Device, Job, Placement, Running
from agent.policy.state import RunKey


@dataclass(frozen=True, slots=True)
class Move:
    """Move ``job_id`` to ``placement``; it should end ``gain_s`` sooner."""

    job_id: str
    placement: Placement
    gain_s: float
    model: str
    swap_with: str | None = None
    """A job starting in this pass that takes the moved job's devices instead."""
    after: tuple[str, ...] = ()
    """Jobs stopped in this pass whose devices it takes: it moves once they have stopped."""


def for_speed(cfg: PolicyConfig) -> bool:
    """Whether jobs move for speed: with ``moves`` on, under every objective but ``packing``,
    where speed counts nothing (a move there would only take idle GPUs for a job already
    placed)."""
    return cfg.moves and cfg.objective != "packing"


def movable(r: Running, ctx: Context) -> bool:
    job = r.job
    if job.is_gang or job.is_share or job.kind == "inference" or job.gpus_per_node == 0:
        return False
    if job.is_elastic:
        return False  # an elastic job is resized, not moved (agent.owning.elastic)
    if ctx.config.moves_keep_work and not job.preemptible and r.last_checkpoint_at is None:
        return False  # it would start over: a preemption it was not submitted to take
    since = r.moved_at if r.moved_at is not None else r.started_at
    return ctx.snapshot.now - since >= ctx.config.min_run_s


def _worth(rem_s: float, gain_s: float, ctx: Context) -> bool:
    cfg = ctx.config
    return gain_s >= cfg.move_min_gain_s and gain_s >= cfg.move_min_gain_fraction * rem_s


MOVE_SCAN = 128
"""Running jobs looked at for moves in one pass, at most (those that would gain most first)."""


def _members(group: dict[str, Running], limit: int = 32) -> list[Running]:
    out = []
    for r in group.values():
        out.append(r)
        if len(out) >= limit:
            break
    return out


def moves_to_idle(
    ctx: Context,
    groups: dict[RunKey, dict[str, Running]],
    busy: set[str],
    reserved: frozenset[str] = frozenset(),
    potential: dict[tuple[object, ...], tuple[float, float]] | None = None,
) -> list[Move]:
    """Moves of running jobs onto capacity left idle (applied to the index as decided), never
    onto ``reserved`` nodes (held for a job that waits). ``potential`` memoizes, across passes,
    the best speed each group of running jobs could reach on the idle kinds of device."""
    cfg = ctx.config
    if not for_speed(cfg) or cfg.max_moves <= 0:
        return []
    idle = {k: ctx.index.max_whole_free(k) for k in ctx.index.kinds()}
    idle = {k: n for k, n in idle.items() if n > 0}
    if not idle:
        return []
    potential = {} if potential is None else potential
    if len(potential) > 50_000:
        potential.clear()
    by_gpus: dict[int, tuple[DeviceKind, ...]] = {}
    hopeful: list[tuple[float, float, float, dict[str, Running]]] = []
    for run_key, group in groups.items():
        job_class, kind, g, model = run_key
        if kind == "inference":
            continue
        kinds = by_gpus.get(g)
        if kinds is None:
            kinds = by_gpus[g] = tuple(k for k, n in idle.items() if n >= g)
        if not kinds:
            continue
        memo = (run_key, kinds)
        held = potential.get(memo)
        if held is None:
            here = best = ctx.model.relative(job_class, kind, model, g)
            sample = next(iter(group.values())).job
            key = ctx.key(sample)
            for k in kinds:
                if kind_reason(sample, key, k, ctx) is None:
                    best = max(best, ctx.model.relative(job_class, kind, k.model, g))
            held = potential[memo] = (here, best)
        here, best = held
        if best > here * 1.05:
            hopeful.append((best / here, here, best, group))
    hopeful.sort(key=lambda h: -h[0])
    options: list[tuple[float, Running, float, float]] = []
    budget = MOVE_SCAN
    for _ratio, here, best, group in hopeful:
        if budget <= 0:
            break
        for r in _members(group, min(32, budget)):
            budget -= 1
            if r.job.job_id in busy or not movable(r, ctx):
                continue
            rem = remaining_s(r, ctx)[0]
            bound = rem * (1.0 - here / best) - cfg.move_cost_s
            if _worth(rem, bound, ctx):
                options.append((bound, r, here, rem))
    options.sort(key=lambda o: (-o[0], o[1].job.job_id))
    out: list[Move] = []
    for _bound, r, here, rem in options[: cfg.max_moves * 3]:
        if len(out) >= cfg.max_moves:
            break
        cands = rank(r.job, ctx, limit=1, exclude=reserved | frozenset(r.placement.node_ids))
        if not cands:
            continue
        c = cands[0]
        gain = rem - (rem * here / max(c.speed, 1e-9) + cfg.move_cost_s)
        if not _worth(rem, gain, ctx):
            continue
        apply.take(ctx.index, r.job, c.placement)
        apply.release(ctx.index, r.job, r.placement)
        busy.add(r.job.job_id)
        out.append(Move(r.job.job_id, c.placement, gain, c.model))
    return out


def swap_for(
    starter: Job,
    cand: Candidate,
    ctx: Context,
    groups: dict[RunKey, dict[str, Running]],
    busy: set[str],
) -> tuple[Move, Running] | None:
    """A running job that gains far more from ``cand``'s devices than ``starter`` does, and
    whose devices ``starter`` can use: the move, and the job moved (whose place the starter
    takes)."""
    cfg = ctx.config
    if not for_speed(cfg) or starter.is_gang or starter.is_share or starter.gpus_per_node == 0:
        return None
    if len(cand.placement.node_ids) != 1:
        return None
    target = ctx.index.node(cand.node_id)
    if target is None:
        return None
    fast = cand.model
    g = starter.gpus_per_node
    key = ctx.key(starter)
    best: tuple[float, Running] | None = None
    for (job_class, kind, rg, slow), group in groups.items():
        if rg != g or slow == fast or kind == "inference":
            continue
        r_here = ctx.model.relative(job_class, kind, slow, g)
        r_there = ctx.model.relative(job_class, kind, fast, g)
        s_slow = ctx.model.relative(starter.job_class, starter.kind, slow, g)
        if r_there <= r_here or s_slow <= 0:
            continue
        if r_there / r_here < cfg.swap_ratio * (cand.speed / s_slow):
            continue
        for r in _members(group):
            if r.job.job_id in busy or not movable(r, ctx):
                continue
            if node_reason(r.job, target) is not None or not host_room(r.job, target, (starter,)):
                continue
            rem = remaining_s(r, ctx)[0]
            gain = rem - (rem * r_here / r_there + cfg.move_cost_s)
            if _worth(rem, gain, ctx) and (best is None or gain > best[0]):
                best = (gain, r)
    if best is None:
        return None
    gain, r = best
    source = ctx.index.node(r.placement.node_id)
    if source is None or node_reason(starter, source) is not None:
        return None
    if not host_room(starter, source, (r.job,)):
        return None
    devices = {d.key: d for d in source.devices}
    for k in r.placement.devices[0]:
        d = devices.get(k)
        if d is None or device_reason(starter, d) is not None:
            return None
    if kind_reason(starter, key, _kind(devices[r.placement.devices[0][0]]), ctx) is not None:
        return None
    busy.add(r.job.job_id)
    return Move(r.job.job_id, cand.placement, gain, fast, swap_with=starter.job_id), r


def _kind(d: Device) -> DeviceKind:
    return kind_of(d)
