"""Score terms: what a place is worth to a job, one small function each, added with weights.

Device-level terms (the same on every node of a group of interchangeable nodes):

- ``speed``: log of the job's expected speed there (the throughput model, with the slowdown of
  sharing a GPU). Between two jobs, the device goes to the one that gains most from it: that is
  settled when a pass starts several jobs at once (:mod:`agent.policy.decision`), not here;
- ``fragmentation``: the capacity the placement leaves unusable to the workload's shapes (FGD);
- ``packing``: under the ``packing`` objective (where ``speed`` counts nothing), the GPUs the
  placement leaves free on the node, taken away: the fuller node of two that fit alike;
- ``link``: a multi-GPU job's GPUs on one NVLink/xGMI domain;
- ``energy``: an inference job's watts with the ``energy`` objective, and under ``performance``
  a job's of a kind whose fastest device is not needed (``efficient_kinds``: inference), so that
  with ``speed`` the score is its performance per watt.

Node-level terms:

- ``data``: the time the bytes of its datasets the node lacks take to arrive (partial copies
  count), at the rates the node measured from their holders (its ``place`` record; the node's
  bandwidth only when it measured none), plus the RTT to the nearest holder, as a fraction of the
  job's expected run;
- ``heat``, ``power``: a GPU close to its slowdown temperature or its power limit;
- ``cost``: with the ``cost`` objective, the node's cost per hour, so that with ``speed`` the score
  is performance per unit of cost;
- ``spread``: a small owner-specific tie-break, so two owners do not offer to the same node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final

from agent.policy.context import Context, spread_hash
from agent.policy.prior import REFERENCE_MODEL, catalog_watts
from agent.policy.snapshot import Device, Job, Node


@dataclass(frozen=True, slots=True)
class Fit:
    """How a job would sit on the devices of one group of nodes."""

    positions: tuple[int, ...]
    """Device positions in the group's signature order."""
    model: str
    speed: float
    """Reference seconds of work done per second there (sharing slowdown included)."""
    frag_delta: float
    """Fragmentation added, in GPUs (negative: the placement removes some)."""
    linked: bool = False
    share_bytes: int = 0
    free_after: float = 0.0
    """GPUs (fractions of shared ones) left free on the node once the job is placed."""


def speed_term(job: Job, fit: Fit, ctx: Context) -> float:
    if ctx.config.objective == "packing":
        return 0.0
    return ctx.config.weights.speed * math.log(max(fit.speed, 1e-6))


def packing_term(job: Job, fit: Fit, ctx: Context) -> float:
    """Under the ``packing`` objective, the fuller node of two that fit alike."""
    if ctx.config.objective != "packing":
        return 0.0
    return -ctx.config.weights.packing * fit.free_after


def fragmentation_term(job: Job, fit: Fit, ctx: Context) -> float:
    return -ctx.config.weights.fragmentation * fit.frag_delta


def link_term(job: Job, fit: Fit, ctx: Context) -> float:
    if fit.linked and job.gpus_per_node > 1 and job.interconnect is None:
        return ctx.config.weights.link
    return 0.0


def energy_term(job: Job, fit: Fit, ctx: Context) -> float:
    """With ``speed``, log of performance per watt (at the default weights)."""
    cfg = ctx.config
    if cfg.objective == "energy":
        if job.kind != "inference":
            return 0.0
    elif cfg.objective != "performance" or job.kind not in cfg.efficient_kinds:
        return 0.0
    watts, ref = catalog_watts(fit.model), catalog_watts(REFERENCE_MODEL)
    if not watts or not ref:
        return 0.0
    return -ctx.config.weights.objective * math.log(watts / ref)


GROUP_TERMS: Final[tuple[tuple[str, Callable[[Job, Fit, Context], float]], ...]] = (
    ("speed", speed_term),
    ("fragmentation", fragmentation_term),
    ("packing", packing_term),
    ("link", link_term),
    ("energy", energy_term),
)


def transfer_s(job: Job, node: Node, ctx: Context) -> float:
    """Seconds for the bytes of the job's datasets the node lacks (partial copies count) to
    arrive from their nearest holders. ``NAME`` is the newest version in the mesh."""
    total = 0.0
    snap = ctx.snapshot
    for ref in job.datasets:
        name = ref.partition("@")[0]
        newest = snap.dataset_newest.get(name) if name == ref else None
        key = ref if newest is None else f"{name}@{newest}"
        if key in node.datasets or (newest is None and ref in node.datasets):
            continue
        size = snap.dataset_bytes.get(key, snap.dataset_bytes.get(ref, 0))
        held = node.dataset_held.get(key, 0)
        if size and held >= size:
            continue
        size = max(0, size - held)
        rtt = 0.0
        holders = ctx.index.datasets.get(key) or ctx.index.datasets.get(ref)
        if not holders:
            continue  # held by no node: it comes from outside the mesh wherever the job runs
        if node.coord is not None:
            best = math.inf
            for i, holder_id in enumerate(holders):
                if i >= 32:
                    break
                holder = ctx.index.node(holder_id)
                if holder is not None and holder.coord is not None:
                    best = min(best, node.coord.distance_s(holder.coord))
            rtt = 0.0 if best == math.inf else best
        total += size / fetch_rate(node, holders) + rtt
    return total


MAX_HOLDERS_RATED: Final = 8
"""The swarm takes from several holders at once: the measured rates of the fastest this many
add up (``agent.content.swarm``)."""


def fetch_rate(node: Node, holders: Collection[str]) -> float:
    """Bytes/s the node fetches at from ``holders``: the sum of the fastest rates it measured
    from them; none measured, its link's guess (``network_gbps``)."""
    rates = node.fetch_rates
    if rates:
        measured = sorted((rates[h] for h in holders if h in rates), reverse=True)
        rate = sum(measured[:MAX_HOLDERS_RATED])
        if rate > 0:
            return rate
    return node.network_gbps * 1e9 / 8


def data_term(job: Job, node: Node, devices: Sequence[Device], fit: Fit, ctx: Context) -> float:
    if not job.datasets:
        return 0.0
    moving = transfer_s(job, node, ctx)
    if moving <= 0:
        return 0.0
    run_s = ctx.duration_s(job, fit.speed)[0]
    return -ctx.config.weights.data * min(1.0, moving / max(run_s, 60.0))


def heat_term(job: Job, node: Node, devices: Sequence[Device], fit: Fit, ctx: Context) -> float:
    margin = ctx.config.heat_margin_c
    worst = 0.0
    for d in devices:
        if d.temp_c is None or d.temp_slowdown_c is None:
            continue
        worst = max(worst, (d.temp_c - (d.temp_slowdown_c - margin)) / margin)
    return -ctx.config.weights.heat * min(1.0, worst)


def power_term(job: Job, node: Node, devices: Sequence[Device], fit: Fit, ctx: Context) -> float:
    worst = 0.0
    for d in devices:
        if d.power_mw is None or not d.power_limit_mw:
            continue
        worst = max(worst, (d.power_mw / d.power_limit_mw - 0.9) / 0.1)
    return -ctx.config.weights.power * min(1.0, worst)


def cost_term(job: Job, node: Node, devices: Sequence[Device], fit: Fit, ctx: Context) -> float:
    """With ``speed``, log of performance per unit of cost (at the default weights)."""
    if ctx.config.objective != "cost" or not node.cost_per_hour:
        return 0.0
    return -ctx.config.weights.objective * math.log(node.cost_per_hour)


def spread_term(job: Job, node: Node, devices: Sequence[Device], fit: Fit, ctx: Context) -> float:
    return ctx.config.weights.spread * spread_hash(ctx.owner, node.node_id)


NODE_TERMS: Final[
    tuple[tuple[str, Callable[[Job, Node, Sequence[Device], Fit, Context], float]], ...]
] = (
    ("data", data_term),
    ("heat", heat_term),
    ("power", power_term),
    ("cost", cost_term),
    ("spread", spread_term),
)

NODE_TERMS_MAX: Final = 0.011
"""The most the node-level terms can add (``spread``); the rest only take away."""


def group_terms(job: Job, fit: Fit, ctx: Context) -> tuple[tuple[str, float], ...]:
    return tuple((name, term(job, fit, ctx)) for name, term in GROUP_TERMS)


def node_terms(
    job: Job, node: Node, devices: Sequence[Device], fit: Fit, ctx: Context
) -> tuple[tuple[str, float], ...]:
    return tuple((name, term(job, node, devices, fit, ctx)) for name, term in NODE_TERMS)
