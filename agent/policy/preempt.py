"""Preemption: a job that cannot start may take GPUs from preemptible jobs of lower priority.

Never from a job of higher priority, never from one that is not preemptible, and never from one
of equal priority but by time slicing (``PolicyConfig.time_slice``: a preemptible job that has
had less service takes its turn from one that has had much more, as Tiresias does); and never
from one that started (or was last moved) less than ``min_run_s`` ago: a job just started is not
stopped again at once, which is what keeps two jobs from preempting each other in a loop. Of the
sets of victims that would free enough on one node (on enough nodes, for a gang), the policy takes
the one that loses the least work since the victims' last checkpoints (GPU-seconds), then the one
with fewer victims.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.policy.context import Context
from agent.policy.filters import linked_groups, static_fit
from agent.policy.index import kind_of
from agent.policy.place import kind_reason
from agent.policy.queue import level
from agent.policy.snapshot import Device, Job, Node, Placement, Running


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop ``victims`` (with their checkpoint signal) so ``job_id`` can start on ``placement``."""

    job_id: str
    victims: tuple[str, ...]
    placement: Placement
    lost_gpu_s: float
    """Work the victims lose since their last checkpoints, in GPU-seconds."""


def lost_gpu_s(r: Running, now: float) -> float:
    since = r.last_checkpoint_at if r.last_checkpoint_at is not None else r.started_at
    gpus = r.job.gpus if not r.job.is_share else 0.5
    return max(0.0, now - since) * max(gpus, 0.1)


def attained_gpu_s(r: Running, now: float) -> float:
    """The GPU-seconds a running job has had, over all its attempts."""
    return r.job.attained_gpu_s + max(0.0, now - r.started_at) * max(r.job.gpus, 1)


def outranks(job: Job, victim: Running, ctx: Context) -> bool:
    """A higher priority; or, time slicing, the same priority and a lower service level (both
    preemptible: a job that may not be stopped does not stop others for its turn either)."""
    if job.priority != victim.job.priority:
        return job.priority > victim.job.priority
    levels = ctx.config.time_slice
    if not levels or not job.preemptible:
        return False
    victim_level = ctx.levels.get(victim.job.job_id)
    if victim_level is None:
        victim_level = level(attained_gpu_s(victim, ctx.snapshot.now), levels)
        ctx.levels[victim.job.job_id] = victim_level
    return level(job.attained_gpu_s, levels) < victim_level


def may_preempt(job: Job, victim: Running, ctx: Context) -> bool:
    """The rules: it outranks the victim, which is preemptible and past its minimum run time."""
    if not victim.job.preemptible or not outranks(job, victim, ctx):
        return False
    since = victim.moved_at if victim.moved_at is not None else victim.started_at
    return ctx.snapshot.now - since >= ctx.config.min_run_s


def devices_if_freed(
    job: Job, node: Node, freed: set[str], share_freed: dict[str, int], ok: frozenset[str]
) -> tuple[str, ...] | None:
    """The devices ``job`` would take on ``node`` once ``freed`` are, or ``None`` (``ok``: the
    keys of the node's devices that pass the job's device filters)."""
    usable: list[Device] = []
    for d in node.devices:
        if d.key not in ok:
            continue
        if job.is_share:
            room = d.share_free_bytes + share_freed.get(d.key, 0)
            if d.key in freed or (d.whole_job is None and room >= job.share_bytes_on(d)):
                return (d.key,)
            continue
        if d.is_free or d.key in freed:
            usable.append(d)
    if job.is_share:
        return None
    want = job.gpus_per_node
    by_vendor: dict[str, list[Device]] = {}
    for d in usable:
        by_vendor.setdefault(d.vendor, []).append(d)
    for group in by_vendor.values():
        for linked in linked_groups(job, group):
            if len(linked) >= want:
                ordered = sorted(linked, key=lambda d: d.key not in freed)
                return tuple(d.key for d in ordered[:want])
    return None


def fitting_keys(job: Job, node: Node, ctx: Context) -> frozenset[str] | None:
    """The keys of ``node``'s devices that pass ``job``'s device filters, or ``None`` if the
    node can never host it (:func:`static_fit`); memoized while the index's static facts hold."""
    memo = (job.job_id, node.node_id)
    version = ctx.index.static_version
    held = ctx.static_fits.get(memo)
    if held is not None and held[0] == version and held[1] is job:
        return held[2]
    ok: frozenset[str] | None = None
    if static_fit(job, node) is None:
        key = ctx.key(job)
        ok = frozenset(
            d.key for d in node.devices if kind_reason(job, key, kind_of(d), ctx) is None
        )
    ctx.static_fits[memo] = (version, job, ok)
    return ok


def _on_node(
    job: Job, node: Node, runs: Sequence[Running], ctx: Context, *, checked: bool = False
) -> tuple[float, tuple[Running, ...], tuple[str, ...]] | None:
    """The cheapest victims on ``node`` that make room for (a member of) ``job`` (``checked``:
    every one of ``runs`` is known to pass :func:`may_preempt` for it)."""
    ok = fitting_keys(job, node, ctx)
    if ok is None:
        return None
    room = (node.cpu_milli_free is None or node.cpu_milli_free >= job.cpu_milli) and (
        node.host_mem_free_bytes is None or node.host_mem_free_bytes >= job.host_mem_bytes
    )
    fits = devices_if_freed(job, node, set(), {}, ok) if room else None
    if fits is not None:
        return 0.0, (), fits
    now = ctx.snapshot.now
    eligible = sorted(
        (r for r in runs if checked or may_preempt(job, r, ctx)),
        key=lambda r: (lost_gpu_s(r, now), r.job.job_id),
    )
    freed: set[str] = set()
    share_freed: dict[str, int] = {}
    chosen: list[Running] = []
    cpu_free, mem_free = node.cpu_milli_free, node.host_mem_free_bytes
    for r in eligible:
        chosen.append(r)
        if cpu_free is not None:
            cpu_free += r.job.cpu_milli
        if mem_free is not None:
            mem_free += r.job.host_mem_bytes
        for node_id, keys in zip(r.placement.node_ids, r.placement.devices, strict=True):
            if node_id != node.node_id:
                continue
            if r.placement.share_mem_bytes:
                for k in keys:
                    share_freed[k] = share_freed.get(k, 0) + r.placement.share_mem_bytes
            else:
                freed.update(keys)
        if (cpu_free is not None and cpu_free < job.cpu_milli) or (
            mem_free is not None and mem_free < job.host_mem_bytes
        ):
            continue
        fits = devices_if_freed(job, node, freed, share_freed, ok)
        if fits is not None:
            return sum(lost_gpu_s(v, now) for v in chosen), tuple(chosen), fits
    return None


def preempt_for(
    job: Job, ctx: Context, running_by_node: dict[str, list[Running]], *, checked: bool = False
) -> Preemption | None:
    """The cheapest legal preemption that lets ``job`` start, or ``None`` (``checked``: the
    caller has kept only the jobs :func:`may_preempt` allows)."""
    if not ctx.config.preemption or job.gpus_per_node == 0:
        return None
    options: list[tuple[float, int, str, tuple[Running, ...], tuple[str, ...]]] = []
    for node_id, runs in running_by_node.items():
        entry = ctx.index.entries.get(node_id)
        if entry is None:
            continue
        found = _on_node(job, entry.node, runs, ctx, checked=checked)
        if found is not None:
            cost, victims, keys = found
            options.append((cost, len(victims), node_id, victims, keys))
    if not job.is_gang:
        real = [o for o in options if o[3]]
        if not real:
            return None
        cost, _n, node_id, victims, keys = min(real, key=lambda o: (o[0], o[1], o[2]))
        return Preemption(
            job.job_id,
            tuple(v.job.job_id for v in victims),
            Placement((node_id,), (keys,), _share_bytes(job, ctx, node_id, keys)),
            cost,
        )
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    picked = options[: job.nodes]
    if len(picked) < job.nodes or not any(o[3] for o in picked):
        return None
    victims_by_id: dict[str, Running] = {}
    for o in picked:
        for v in o[3]:
            victims_by_id[v.job.job_id] = v
    now = ctx.snapshot.now
    return Preemption(
        job.job_id,
        tuple(sorted(victims_by_id)),
        Placement(tuple(o[2] for o in picked), tuple(o[4] for o in picked)),
        sum(lost_gpu_s(v, now) for v in victims_by_id.values()),
    )


def _share_bytes(job: Job, ctx: Context, node_id: str, keys: tuple[str, ...]) -> int:
    if not job.is_share:
        return 0
    node = ctx.index.node(node_id)
    device = next((d for d in node.devices if d.key == keys[0]), None) if node else None
    return job.share_bytes_on(device) if device is not None else (job.share_mem_bytes or 0)
