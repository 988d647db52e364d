"""Shrinking elastic jobs to make room: before a pending job preempts anyone, an elastic job
running above its fewest GPUs on a node may give back what it holds beyond them.

The shrunk job is stopped with its checkpoint signal and restarts from its checkpoint with
fewer GPUs (as many as its node then has room for, never fewer than its minimum); unlike a
preemption this needs no difference of priority: the job loses only the work since its last
checkpoint and keeps running. A job is shrunk only after it has run ``min_run_s`` since its
last start (a resize restarts it), so jobs are never grown and shrunk in a loop.

Pure: the owner's placement calls :func:`shrink_for` over the running jobs its view believes
(``agent.owning.placement.ShoalPlacement.shrink``), and the runner checks what it is asked
(``agent.running.preemption``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.policy.context import Context
from agent.policy.filters import device_reason, node_reason
from agent.policy.snapshot import Job, Placement, Running


@dataclass(frozen=True, slots=True)
class Shrink:
    """Start a job on ``placement`` once ``victims`` (elastic jobs there) are shrunk."""

    placement: Placement
    victims: tuple[str, ...]


def spare_gpus(r: Running) -> int:
    """The GPUs an elastic job holds beyond its fewest (0 for any other job)."""
    if not r.job.is_elastic or r.job.is_gang:
        return 0
    return max(0, len(r.placement.devices[0]) - r.job.gpus_per_node)


def shrinkable(r: Running, ctx: Context) -> bool:
    """An elastic job above its minimum that has run ``min_run_s`` since it last started."""
    since = r.moved_at if r.moved_at is not None else r.started_at
    return spare_gpus(r) > 0 and ctx.snapshot.now - since >= ctx.config.min_run_s


def shrink_for(job: Job, ctx: Context, by_node: Mapping[str, Sequence[Running]]) -> Shrink | None:
    """The node where shrinking the fewest elastic jobs makes room for ``job`` (its minimum,
    if it is elastic itself), taking its free devices first; or ``None``. Whole GPUs on one
    node only, and no required link between them (a shrink gives back arbitrary devices)."""
    if job.is_gang or job.is_share or job.gpus_per_node == 0:
        return None
    if job.interconnect not in (None, "pcie") and job.gpus_per_node > 1:
        return None
    want = job.gpus_per_node
    best: tuple[tuple[int, str], Shrink] | None = None
    for node_id, runs in by_node.items():
        node = ctx.index.node(node_id)
        if node is None or node_reason(job, node) is not None:
            continue
        fits = {d.key for d in node.devices if device_reason(job, d) is None}
        picked = [d.key for d in node.devices if d.is_free and d.key in fits][:want]
        victims: list[str] = []
        ordered = sorted(
            (r for r in runs if shrinkable(r, ctx)), key=lambda r: (-spare_gpus(r), r.job.job_id)
        )
        for r in ordered:
            if len(picked) >= want:
                break
            usable = [k for k in r.placement.devices[0] if k in fits]
            take = usable[: min(spare_gpus(r), want - len(picked))]
            if take:
                victims.append(r.job.job_id)
                picked.extend(take)
        if len(picked) < want or not victims:
            continue
        rank = (len(victims), node_id)
        if best is None or rank < best[0]:
            placement = Placement((node_id,), (tuple(picked),))
            best = (rank, Shrink(placement, tuple(victims)))
    return None if best is None else best[1]


__all__ = ["Shrink", "shrink_for", "shrinkable", "spare_gpus"]
