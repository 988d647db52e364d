"""Growing elastic jobs onto idle capacity: how many GPUs an elastic job would run on if it
restarted on its node now.

An elastic job below its most GPUs grows only onto devices of its own node that are free and
that it accepts, and only while no waiting job could start on them (a job that waits comes
first: growing would only be undone by a shrink). Its owner decides when (the devices idle long
enough, the job run long enough since it last started: ``agent.owning.elastic.Growth``) and restarts
it from its checkpoint; the policy places it again at the size that then fits
(:func:`agent.policy.place.rank`).
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.policy.filters import device_reason, node_reason
from agent.policy.snapshot import Job, Node


def grow_to(job: Job, holding: int, node: Node, waiting: Iterable[Job]) -> int | None:
    """The GPUs ``job`` (elastic, holding ``holding`` devices of ``node``) would take there if it
    restarted now, when more than it holds and no job of ``waiting`` could use the idle ones;
    else ``None``."""
    most = job.gpus_max_per_node
    if most is None or holding >= most or job.is_gang:
        return None
    free = [d for d in node.devices if d.is_free]
    usable = [d for d in free if device_reason(job, d) is None]
    if not usable:
        return None
    for other in waiting:
        if other.gpus_per_node == 0 or other.is_gang or node_reason(other, node) is not None:
            continue
        need = 1 if other.is_share else other.gpus_per_node
        fits = [d for d in node.devices if device_reason(other, d) is None]
        if other.is_share:
            fits = [d for d in fits if d.share_free_bytes >= other.share_bytes_on(d)]
        else:
            fits = [d for d in fits if d.is_free]
        if len(fits) >= need:
            return None  # it waits and could start there: it comes first
    return min(most, holding + len(usable))


__all__ = ["grow_to"]
