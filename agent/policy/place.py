"""Where one job could go now: ranked candidates on single nodes (whole GPUs, a share of one, or
no GPU), from the capacity index.

An elastic job (a range of GPUs) is ranked at the most GPUs up to its maximum that some node
has room for now, never fewer than its minimum (:func:`rank`, :func:`at_size`).

Each group of interchangeable nodes is evaluated once (:func:`group_fit`: which devices, at what
speed, adding what fragmentation); then a few of its nodes get the node-level terms, always
including the nodes that hold the job's datasets. Gangs are :mod:`agent.policy.gangs`.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from agent.policy.context import Context, ReqKey
from agent.policy.filters import device_reason, node_reason
from agent.policy.fragmentation import node_fragmentation
from agent.policy.index import DeviceKind, Group, kind_of
from agent.policy.scoring import Fit, group_terms, node_terms
from agent.policy.snapshot import Device, Job, Placement


@dataclass(frozen=True, slots=True)
class Candidate:
    """One place a job could start now, with the score that ranks it and its parts."""

    placement: Placement
    score: float
    terms: tuple[tuple[str, float], ...]
    speed: float
    """Reference seconds of work per second there."""
    model: str

    @property
    def node_id(self) -> str:
        return self.placement.node_id

    def why(self) -> str:
        return score_words(self.terms)


def score_words(terms: tuple[tuple[str, float], ...]) -> str:
    """A score's largest parts, for the operator: ``speed +0.69, fragmentation -0.12``."""
    parts = sorted((t for t in terms if abs(t[1]) >= 0.005), key=lambda t: -abs(t[1]))
    return ", ".join(f"{name} {value:+.2f}" for name, value in parts[:4]) or "only fit"


@dataclass(frozen=True, slots=True)
class GroupFit:
    fit: Fit
    score: float
    terms: tuple[tuple[str, float], ...]


def kind_reason(job: Job, key: ReqKey, kind: DeviceKind, ctx: Context) -> str | None:
    """Why devices of ``kind`` can never serve the job (memoized per requirement)."""
    memo = (key, kind)
    if memo in ctx.kind_ok:
        return ctx.kind_ok[memo]
    probe = Device(
        key="",
        model=kind.model,
        vendor=kind.vendor,
        backend=kind.backend,
        arch=kind.arch,
        compute_capability=kind.compute_capability,
        mem_total_bytes=kind.mem_total_bytes,
        healthy=kind.healthy,
    )
    reason = device_reason(job, probe)
    ctx.kind_ok[memo] = reason
    return reason


def could_fit_now(job: Job, ctx: Context) -> bool:
    """A cheap necessary condition: some schedulable node has the capacity ``job`` needs."""
    index = ctx.index
    if job.cpu_milli:
        most = index.max_cpu_free()
        if most is not None and most < job.cpu_milli:
            return False
    if job.gpus_per_node == 0:
        return True
    key = ctx.key(job)
    for kind in index.kinds():
        if kind_reason(job, key, kind, ctx) is not None:
            continue
        if job.is_share:
            need = job.share_mem_bytes or int((job.share_fraction or 0.0) * kind.mem_total_bytes)
            if index.max_share_free(kind) >= max(need, 1):
                return True
        elif index.max_whole_free(kind) >= job.gpus_per_node:
            return True
    return False


def _frag(ctx: Context, group: Group, free: tuple[float, ...], cpu_free: int | None) -> float:
    """Fragmentation of a node of ``group`` with ``free`` and ``cpu_free`` (the GPUs' models
    read only when a workload shape accepts only some)."""
    models = group.models if ctx.frag_models else None
    return node_fragmentation(free, cpu_free, ctx.shapes, ctx.frag_cache, ctx.frag_vectors, models)


def group_fit(job: Job, group: Group, ctx: Context, *, gpus: int | None = None) -> GroupFit | None:
    """The best way ``job`` (``gpus`` per node) sits on a node of ``group``, or ``None``."""
    key = ctx.key(job)
    memo = (key, group.serial, -1 if gpus is None else gpus)
    held = ctx.group_cache.get(memo, False)
    if held is not False:
        return held  # type: ignore[return-value]
    result = _group_fit(job, key, group, ctx, job.gpus_per_node if gpus is None else gpus)
    ctx.group_cache[memo] = result
    return result


def _group_fit(job: Job, key: ReqKey, group: Group, ctx: Context, want: int) -> GroupFit | None:
    if job.cpu_milli and group.cpu_free is not None and group.cpu_free < job.cpu_milli:
        return None
    if job.host_mem_bytes and group.mem_free is not None and group.mem_free < job.host_mem_bytes:
        return None
    cpu_after = None if group.cpu_free is None else group.cpu_free - job.cpu_milli
    fits: list[Fit] = []
    if want == 0:
        before = _frag(ctx, group, group.free_fractions, group.cpu_free)
        after = _frag(ctx, group, group.free_fractions, cpu_after)
        fits.append(Fit((), "cpu", 1.0, after - before, free_after=sum(group.free_fractions)))
    elif job.is_share:
        before = _frag(ctx, group, group.free_fractions, group.cpu_free)
        seen: set[object] = set()
        for i, slot in enumerate(group.slots):
            if slot.free_fraction <= 0.0 or (slot.kind, slot.free_fraction, slot.sharers) in seen:
                continue
            seen.add((slot.kind, slot.free_fraction, slot.sharers))
            if kind_reason(job, key, slot.kind, ctx) is not None:
                continue
            mem = slot.kind.mem_total_bytes
            need = job.share_mem_bytes or int((job.share_fraction or 0.0) * mem)
            if need <= 0 or slot.share_free_bytes < need:
                continue
            free = list(group.free_fractions)
            free[i] = (slot.share_free_bytes - need) / mem if mem else 0.0
            after = _frag(ctx, group, tuple(free), cpu_after)
            speed = ctx.model.relative(job.job_class, job.kind, slot.kind.model)
            speed *= ctx.model.share_factor(job.job_class, slot.sharers, slot.kind.model)
            fits.append(
                Fit(
                    (i,),
                    slot.kind.model,
                    speed,
                    after - before,
                    share_bytes=need,
                    free_after=sum(free),
                )
            )
    else:
        for kind, idle in group.whole_free.items():
            if idle < want or kind_reason(job, key, kind, ctx) is not None:
                continue
            before = _frag(ctx, group, group.free_fractions, group.cpu_free)
            fit = _whole_fit(job, group, kind, want, ctx, before, cpu_after)
            if fit is not None:
                fits.append(fit)
    best: GroupFit | None = None
    for fit in fits:
        terms = group_terms(job, fit, ctx)
        score = sum(v for _, v in terms)
        if best is None or score > best.score:
            best = GroupFit(fit, score, terms)
    return best


def _whole_fit(
    job: Job,
    group: Group,
    kind: DeviceKind,
    want: int,
    ctx: Context,
    before: float,
    cpu_after: int | None,
) -> Fit | None:
    by_domain: dict[str | None, list[int]] = {}
    for i, slot in enumerate(group.slots):
        if slot.kind == kind and slot.free_fraction >= 1.0:
            by_domain.setdefault(slot.link_domain, []).append(i)
    linked_pick: list[int] | None = None
    for domain, positions in by_domain.items():
        if domain is None or len(positions) < want:
            continue
        kinds = {group.slots[i].link_kind for i in positions}
        if job.interconnect not in (None, "pcie") and job.interconnect not in kinds:
            continue
        if linked_pick is None or len(positions) < len(linked_pick):
            linked_pick = positions  # the fullest domain that still fits: best fit
    if job.interconnect not in (None, "pcie") and want > 1 and linked_pick is None:
        return None
    if linked_pick is not None and want > 1:
        picked, linked = linked_pick[:want], True
    else:
        every = [i for positions in by_domain.values() for i in positions]
        picked, linked = sorted(every)[:want], False
    free = list(group.free_fractions)
    for i in picked:
        free[i] = 0.0
    after = _frag(ctx, group, tuple(free), cpu_after)
    speed = ctx.model.relative(job.job_class, job.kind, kind.model, max(want, 1))
    return Fit(
        tuple(picked), kind.model, speed, after - before, linked=linked, free_after=sum(free)
    )


def _members(group: Group, ctx: Context, job: Job, limit: int) -> Iterable[str]:
    """Up to ``limit`` members, starting at an owner-specific offset (owners spread out), plus
    every member holding one of the job's datasets."""
    members = group.members
    n = len(members)
    if n <= limit:
        yield from members
        return
    ids = list(members)
    start = hash_index(ctx.owner, job.job_id, n)
    picked = set()
    for k in range(limit):
        node_id = ids[(start + k) % n]
        picked.add(node_id)
        yield node_id
    for name in job.datasets:
        for node_id in ctx.index.datasets.get(name, ()):
            if node_id in members and node_id not in picked:
                picked.add(node_id)
                yield node_id


def hash_index(owner: str | None, job_id: str, n: int) -> int:
    return zlib.crc32(f"{owner or ''}|{job_id}".encode()) % n


def rank(
    job: Job,
    ctx: Context,
    *,
    limit: int | None = None,
    exclude: frozenset[str] = frozenset(),
    prefer: str | None = None,
) -> list[Candidate]:
    """Single-node places where ``job`` could start now, best first (at most ``limit``); an
    elastic job's at the largest size any node has room for."""
    if job.gpus_max_per_node is not None:
        for size in range(job.gpus_max_per_node, job.gpus_per_node - 1, -1):
            found = rank(at_size(job, size), ctx, limit=limit, exclude=exclude, prefer=prefer)
            if found:
                return found
        return []
    limit = ctx.config.alternates + 1 if limit is None else limit
    if not could_fit_now(job, ctx):
        return []
    fitted: list[tuple[float, Group, GroupFit]] = []
    for group in ctx.index.groups.values():
        gf = group_fit(job, group, ctx)
        if gf is not None:
            fitted.append((gf.score, group, gf))
    if not fitted:
        return []
    fitted.sort(key=lambda t: -t[0])
    out: list[Candidate] = []
    scan = ctx.config.scan_per_group
    bonus = ctx.config.weights.spread
    for base, group, gf in fitted:
        if len(out) >= limit and base + bonus < out[-1].score and not job.datasets:
            break
        for node_id in _members(group, ctx, job, scan):
            cand = candidate_on(job, node_id, gf, ctx, exclude=exclude)
            if cand is not None:
                out.append(cand)
        out.sort(key=lambda c: (-c.score, c.node_id))
        del out[max(limit, 1) * 4 :]
    if prefer is not None:
        out.sort(key=lambda c: c.node_id != prefer)
    return out[:limit]


def at_size(job: Job, gpus: int) -> Job:
    """An elastic job fixed at ``gpus`` GPUs (as it runs, or as it would be placed)."""
    return dataclasses.replace(job, gpus_per_node=gpus, gpus_max_per_node=None)


def candidate_on(
    job: Job, node_id: str, gf: GroupFit, ctx: Context, *, exclude: frozenset[str] = frozenset()
) -> Candidate | None:
    """``gf`` made concrete on one node of its group (``None`` if a node filter refuses it)."""
    if node_id in exclude:
        return None
    entry = ctx.index.entries[node_id]
    node = entry.node
    if node_reason(job, node) is not None:
        return None
    devices = [entry.ordered[i] for i in gf.fit.positions]
    extra = node_terms(job, node, devices, gf.fit, ctx)
    score = gf.score + sum(v for _, v in extra)
    placement = Placement((node_id,), (tuple(d.key for d in devices),), gf.fit.share_bytes)
    return Candidate(placement, score, gf.terms + extra, gf.fit.speed, gf.fit.model)


def best_speed(job: Job, ctx: Context) -> float:
    """The job's speed on the fastest kind of device in the fleet that it accepts."""
    key = ctx.key(job)
    best = 0.0
    gpus = max(job.gpus_per_node, 1)
    for kind in ctx.index.kinds():
        if kind_reason(job, key, kind, ctx) is None:
            best = max(best, ctx.model.relative(job.job_class, job.kind, kind.model, gpus))
    return best if best > 0 else 1.0


def speed_spread(job: Job, ctx: Context) -> float:
    """How much the job cares which device it gets: log of fastest over slowest acceptable."""
    key = ctx.key(job)
    gpus = max(job.gpus_per_node, 1)
    speeds = [
        ctx.model.relative(job.job_class, job.kind, kind.model, gpus)
        for kind in ctx.index.kinds()
        if kind_reason(job, key, kind, ctx) is None
    ]
    if len(speeds) < 2:
        return 0.0
    return math.log(max(speeds) / max(min(speeds), 1e-9))


__all__ = ["Candidate", "at_size", "best_speed", "could_fit_now", "kind_of", "rank", "speed_spread"]
