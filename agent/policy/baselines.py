"""The placements Shoal is measured against, on the policy's own snapshot types.

- :func:`first_fit`: hard filters only, nodes in id order, the first free devices of one vendor
  that fit. This is ``fifo`` in ``python -m bench.sched`` and what
  :class:`agent.owning.placement.FirstFit` gives the agents' owners (it calls this function).
- :func:`best_fit`: the node (and, for a share, the GPU) left with the least free capacity after
  the placement, CPU and GPU alike, as the FGD paper's BestFit baseline does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agent.policy.filters import device_reason, host_room, linked_groups, node_reason
from agent.policy.snapshot import Device, Job, Node, Placement


def pick(job: Job, node: Node) -> Placement | None:
    """The first free devices of ``node`` that fit ``job``, all of one vendor (first fit)."""
    if node_reason(job, node) is not None or not host_room(job, node):
        return None
    if job.gpus_per_node == 0:
        return Placement((node.node_id,), ((),))
    if job.is_share:
        for d in node.devices:
            if device_reason(job, d) is None and d.share_free_bytes >= max(
                job.share_bytes_on(d), 1
            ):
                return Placement((node.node_id,), ((d.key,),), job.share_bytes_on(d))
        return None
    by_vendor: dict[str, list[Device]] = {}
    for d in node.devices:
        if d.is_free and d.backend != "cpu" and device_reason(job, d) is None:
            by_vendor.setdefault(d.vendor, []).append(d)
    for group in by_vendor.values():
        for linked in linked_groups(job, group):
            if len(linked) >= job.gpus_per_node:  # an elastic job: as many as free, to its most
                n = min(len(linked), job.gpus_max_per_node or job.gpus_per_node)
                keys = tuple(d.key for d in linked[:n])
                return Placement((node.node_id,), (keys,))
    return None


Picker = Callable[[Job, Node], Placement | None]
""":func:`pick`, or a caller's memo of it (the same answer for the same job and node)."""

BestFitter = Callable[[Job, Node], tuple[float, Placement] | None]
""":func:`best_fit_on`, or a caller's memo of it."""


def first_fit(
    job: Job,
    nodes: Sequence[Node],
    *,
    exclude: frozenset[str] = frozenset(),
    prefer: str | None = None,
    limit: int | None = None,
    picker: Picker = pick,
) -> list[Placement]:
    """Every node that fits ``job`` now, in id order (``prefer`` first); gangs: the first
    ``job.nodes`` such nodes, as one placement."""
    out: list[Placement] = []
    for node in sorted(nodes, key=lambda n: (n.node_id != prefer, n.node_id)):
        if node.node_id in exclude:
            continue
        placement = picker(job, node)
        if placement is None:
            continue
        out.append(placement)
        if not job.is_gang and limit is not None and len(out) >= limit:
            break
        if job.is_gang and len(out) >= job.nodes:
            break
    if job.is_gang:
        if len(out) < job.nodes:
            return []
        return [Placement(tuple(p.node_id for p in out), tuple(p.devices[0] for p in out))]
    return out


def _leftover(node: Node, placement: Placement) -> float:
    taken = set(placement.devices[0])
    gpus = 0.0
    for d in node.devices:
        if d.key in taken:
            if placement.share_mem_bytes and d.mem_total_bytes:
                gpus += (d.share_free_bytes - placement.share_mem_bytes) / d.mem_total_bytes
        elif d.is_free:
            gpus += 1.0
        elif d.whole_job is None and d.mem_total_bytes:
            gpus += d.share_free_bytes / d.mem_total_bytes
    total_gpus = max(len(node.devices), 1)
    cpu = 0.0
    if node.cpu_milli_total:
        cpu = (node.cpu_milli_free or 0) / node.cpu_milli_total
    return gpus / total_gpus + cpu


def best_fit(
    job: Job, nodes: Sequence[Node], *, fitter: BestFitter | None = None
) -> list[Placement]:
    """Nodes that fit ``job``, the one left with the least free capacity first (BestFit).
    A share goes to the fitting GPU with the least free memory on that node."""
    on = best_fit_on if fitter is None else fitter
    options: list[tuple[float, str, Placement]] = []
    for node in nodes:
        found = on(job, node)
        if found is not None:
            options.append((found[0], node.node_id, found[1]))
    options.sort(key=lambda o: (o[0], o[1]))
    return [o[2] for o in options]


def best_fit_on(job: Job, node: Node) -> tuple[float, Placement] | None:
    """Where ``job`` goes on ``node`` by BestFit, and the free capacity it leaves there (lower
    is better), or ``None`` if it does not fit."""
    if job.is_share:
        best: Placement | None = None
        room = 0
        for d in node.devices:
            need = job.share_bytes_on(d)
            fits = device_reason(job, d) is None and 0 < need <= d.share_free_bytes
            if fits and (best is None or d.share_free_bytes < room):
                best = Placement((node.node_id,), ((d.key,),), need)
                room = d.share_free_bytes
        placement = best if node_reason(job, node) is None else None
        if placement is not None and job.cpu_milli:
            free_cpu = node.cpu_milli_free
            if free_cpu is not None and free_cpu < job.cpu_milli:
                placement = None
    else:
        placement = pick(job, node)
    if placement is None:
        return None
    cpu_after = 0.0
    if node.cpu_milli_total:
        cpu_after = -job.cpu_milli / node.cpu_milli_total
    return _leftover(node, placement) + cpu_after, placement
