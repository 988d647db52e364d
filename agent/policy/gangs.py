"""Gangs: a job on several nodes starts on all of them or on none.

The members should be alike (one device model, so no member waits for a slower one) and close:
one zone where possible, and no two members further apart than ``gang_rtt_limit_s`` by their
Vivaldi coordinates. Where no model has enough nodes free (a fleet of one host per model), the
members may mix models, penalised as spanning zones are, and the gang is scored at its slowest
member's speed: it runs, at the pace of its slowest, rather than waiting for a set that this fleet
cannot give. Of the sets that fit now, the one with the best score wins: the gang's speed
(Gavel's figure for a job spread over servers where it has one), what the members add to
fragmentation, and penalties for spanning zones and for the largest RTT between members. When no
whole set fits, the gang gets no placement at all: the policy never hands out part of a gang, so
two gangs can never each hold half of what both need.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agent.policy.context import Context
from agent.policy.place import Candidate, candidate_on, could_fit_now, group_fit
from agent.policy.snapshot import Job, Node, Placement


def _max_rtt_s(nodes: Sequence[Node]) -> float:
    worst = 0.0
    for i, a in enumerate(nodes):
        if a.coord is None:
            continue
        for b in nodes[i + 1 :]:
            if b.coord is not None:
                worst = max(worst, a.coord.distance_s(b.coord))
    return worst


def rank_gang(
    job: Job, ctx: Context, *, limit: int | None = None, exclude: frozenset[str] = frozenset()
) -> list[Candidate]:
    """Whole gang sets that could start now, best first."""
    limit = ctx.config.alternates + 1 if limit is None else limit
    if not could_fit_now(job, ctx):
        return []
    want = job.nodes
    members: dict[tuple[str, str], list[Candidate]] = {}
    for group in ctx.index.groups.values():
        gf = group_fit(job, group, ctx)
        if gf is None:
            continue
        for k, node_id in enumerate(group.members):
            if k >= want + ctx.config.scan_per_group:
                break
            cand = candidate_on(job, node_id, gf, ctx, exclude=exclude)
            if cand is None:
                continue
            node = ctx.index.entries[node_id].node
            members.setdefault((node.zone or "", cand.model), []).append(cand)
    sets: list[Candidate] = []
    w = ctx.config.weights
    for (_zone, model), cands in members.items():
        if len(cands) >= want:
            sets.append(_gang(job, model, sorted(cands, key=lambda c: -c.score), ctx, 0.0))
    if not sets:  # no one zone has enough: spread over zones, alike models still
        by_model: dict[str, list[Candidate]] = {}
        for (_zone, model), cands in members.items():
            by_model.setdefault(model, []).extend(cands)
        for model, cands in by_model.items():
            if len(cands) >= want:
                ordered = sorted(cands, key=lambda c: -c.score)
                sets.append(_gang(job, model, ordered, ctx, w.zone))
    sets = [s for s in sets if s.placement.node_ids]
    if not sets:  # no model has enough: mixed models, at the slowest member's speed
        every = sorted((c for cands in members.values() for c in cands), key=lambda c: -c.score)
        mixed = _gang(job, None, every, ctx, 2 * w.zone)
        sets = [mixed] if mixed.placement.node_ids else []
    sets.sort(key=lambda c: (-c.score, c.placement.node_ids))
    return sets[:limit]


def _gang(
    job: Job, model: str | None, ordered: list[Candidate], ctx: Context, zone_penalty: float
) -> Candidate:
    """The best ``job.nodes`` of ``ordered`` (best first) that are close enough together, all of
    ``model``, or of mixed models (``None``: the gang's speed is its slowest member's)."""
    limit = ctx.config.gang_rtt_limit_s
    chosen: list[Candidate] = []
    nodes: list[Node] = []
    for cand in ordered:
        node = ctx.index.entries[cand.node_id].node
        if any(
            node.coord is not None
            and n.coord is not None
            and node.coord.distance_s(n.coord) > limit
            for n in nodes
        ):
            continue
        chosen.append(cand)
        nodes.append(node)
        if len(chosen) == job.nodes:
            break
    if len(chosen) < job.nodes:
        return Candidate(Placement((), ()), -math.inf, (), 0.0, model or "")
    speeds = {
        c.model: ctx.model.relative(job.job_class, job.kind, c.model, job.gpus, consolidated=False)
        for c in chosen
    }
    model, speed = min(speeds.items(), key=lambda ms: ms[1])
    w = ctx.config.weights
    rtt_s = _max_rtt_s(nodes)
    rest = sum(c.score - w.speed * math.log(max(c.speed, 1e-6)) for c in chosen) / len(chosen)
    terms = (
        ("speed", w.speed * math.log(max(speed, 1e-6))),
        ("members", rest),
        ("zone", -zone_penalty),
        ("rtt", -w.rtt * rtt_s / 0.01),
    )
    placement = Placement(
        tuple(c.node_id for c in chosen),
        tuple(c.placement.devices[0] for c in chosen),
    )
    return Candidate(placement, sum(v for _, v in terms), terms, speed, model)
