"""Where a job may run: the ``Placement`` seam the owner asks, with first fit and the Shoal policy
behind it.

The owner asks a ``Placement`` for an ordered list of candidates (node and device keys) from its
gossip view; it then offers the job to each in turn, and the node admits or declines against its
real local state. Both apply the hard filters, first among them the job-spec features the node's
agent runs. When no node fits, :meth:`Placement.why_pending` says what the job waits for, in one
line. The owner tells the placement of each offer a runner started or declined
(:meth:`Placement.offered`): both count those devices in use for a few seconds, until gossip can
have said so (:mod:`agent.owning.recentoffers`). Both turn the view into the policy's snapshot
through :mod:`agent.policy.adapt` and call the policy's own functions:

- :class:`FirstFit` (``placement = "fifo"``): hard filters only, nodes in id order, a preferred
  target first (:func:`agent.policy.baselines.first_fit`), the baseline ``python -m bench.sched``
  calls ``fifo``;
- :class:`ShoalPlacement` (``placement = "shoal"``, the default): the Shoal policy's ranking
  (:func:`agent.policy.decision.rank_any`: speed on each model, fragmentation, data, heat, cost,
  spreading owners apart), and its "why waiting" line (never fits, or waits for busy capacity).

Gangs (``resources.nodes > 1``): :meth:`Placement.gang_candidates` gives whole sets of members,
best first, from the same functions (``first_fit`` takes the first nodes that fit; the Shoal
policy's :func:`agent.policy.gangs.rank_gang` the best set of alike, close nodes). The policy never
returns part of a gang; the owner then prepares every member and commits all or none
(``agent.owning.gang``).

Shares of a GPU are placed by the same model as whole ones: the node record lists the memory
each share holds on its device (``agent.wire.records.NodeRecord.shares``), which the adapter
turns into the policy's ``Device.shares``.

When no node fits, :meth:`Placement.preemption` may name a node and the running jobs to stop
there (the policy's :func:`agent.policy.preempt.preempt_for`, over the running jobs the gossiped
job records name: :func:`agent.policy.adapt.running_from_jobs`); the runner re-checks it
(:mod:`agent.running.preemption`). Only a higher priority preempts on the live mesh: time slicing
(equal priority) runs in the simulator only. Before that, :meth:`Placement.shrink` may name elastic
jobs to shrink to make room (:mod:`agent.policy.shrink`: no priority needed). First fit never
preempts nor shrinks.

Owners place each job behind the pending jobs ahead of it in the mesh's one queue order,
whoever owns them (:mod:`agent.owning.meshqueue`): the Shoal placement runs the policy's decision
pass over those and the job, so room a job ahead takes is not offered, and the first of them that
cannot start holds a reservation later jobs backfill around. First fit keeps no order across
owners.

With team quotas in the held policy (``MeshQueue.teams``), the Shoal placement always runs the
decision pass: a job past its team's maximum gets no candidate and the policy's line, and a
team under its guarantee may reclaim (:meth:`ShoalPlacement.reclaim`: other teams' borrowed,
preemptible jobs, whatever their priority; the runner counts again, ``agent.running.teamdesk``).

With teams, the reclaim may be a guarantee plan that frees one node: its victims and the
movable jobs it moves off go together in one offer (``StartOffer.moves``), and each moved job's
own owner places it again, from its checkpoint, on the GPUs idle elsewhere.

What the live mesh does not do yet: preempting for a gang, and moving running jobs for speed or
for defragmentation without a team's guarantee owed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from agent.job.jobspec import JobSpec, lacking_reason
from agent.mesh.view import NodeView
from agent.owning.meshqueue import MeshQueue
from agent.owning.recentoffers import RecentOffers, mark_held
from agent.policy import adapt, gavel
from agent.policy.baselines import first_fit
from agent.policy.config import OBJECTIVES, Objective, PolicyConfig
from agent.policy.context import Context
from agent.policy.decision import Decisions, context, decide, rank_any
from agent.policy.explain import busy_line, never_reason
from agent.policy.model import ThroughputModel
from agent.policy.preempt import preempt_for
from agent.policy.shrink import shrink_for, spare_gpus
from agent.policy.snapshot import Job, Node, Running, Snapshot
from agent.policy.snapshot import Placement as PolicyPlacement
from agent.policy.state import PolicyState
from agent.policy.teams import Ledger, Teams


@dataclass(frozen=True, slots=True)
class Candidate:
    node_id: str
    devices: tuple[str, ...]
    """Device keys offered to the job on that node (empty for a CPU-only job)."""
    victims: tuple[str, ...] = ()
    """Jobs running there that must be preempted first (none: the devices are free)."""
    shrink: tuple[str, ...] = ()
    """Elastic jobs running there that must be shrunk first (:mod:`agent.policy.shrink`)."""
    moves: tuple[str, ...] = ()
    """Jobs running there that must move off first, to GPUs idle elsewhere (a team's guarantee
    plan: :mod:`agent.policy.guarantee`)."""


GangSet = tuple[Candidate, ...]
"""A whole gang: one member per node, rank 0 first."""


class Placement(Protocol):
    def gang_candidates(
        self,
        spec: JobSpec,
        nodes: Sequence[NodeView],
        *,
        exclude: frozenset[str] = frozenset(),
        queue: MeshQueue | None = None,
    ) -> list[GangSet]:
        """Whole member sets for a gang, best first (never part of one)."""
        ...

    def candidates(
        self,
        spec: JobSpec,
        nodes: Sequence[NodeView],
        *,
        exclude: frozenset[str] = frozenset(),
        prefer: str | None = None,
        queue: MeshQueue | None = None,
    ) -> list[Candidate]:
        """Nodes that pass the hard filters, best first (``nodes`` are live agents); with
        ``queue``, the room left by the mesh's pending jobs ahead
        (:mod:`agent.owning.meshqueue`)."""
        ...

    def why_pending(self, spec: JobSpec, queue: MeshQueue | None = None) -> str:
        """One line saying what the job waits for (asked right after no candidate came)."""
        ...

    def preemption(
        self, spec: JobSpec, nodes: Sequence[NodeView], running: Sequence[Running]
    ) -> Candidate | None:
        """Where the job may start by preempting some of ``running``, and whom; or ``None``."""
        ...

    def shrink(
        self, spec: JobSpec, nodes: Sequence[NodeView], running: Sequence[Running]
    ) -> Candidate | None:
        """Where the job may start by shrinking elastic jobs of ``running``, and which."""
        ...

    def reclaim(
        self, job: Job, nodes: Sequence[NodeView], running: Sequence[Running], teams: Teams
    ) -> Candidate | None:
        """Where ``job`` (with its team) may start by taking back GPUs its team is guaranteed
        from other teams' borrowed, preemptible jobs of ``running``, and whom; or ``None``."""
        ...

    def reserving(self, candidate: Candidate) -> None:
        """``candidate``'s devices are being offered (no answer yet)."""
        ...

    def offered(self, candidate: Candidate) -> None:
        """A runner started or declined an offer of ``candidate``'s devices just now."""
        ...

    def released(self, node_id: str, devices: Sequence[str]) -> None:
        """The job on ``devices`` of ``node_id`` ended, as its runner reported: its offer is
        over, and what the view says of them is to be believed again (a job that ended a moment
        after its start left its GPU held in this owner's eyes for the rest of the hold)."""
        ...

    def likely_nodes(
        self, spec: JobSpec, nodes: Sequence[NodeView], queue: MeshQueue, running: Sequence[Running]
    ) -> tuple[str, ...]:
        """Where the policy's p50 forecast starts the waiting job of ``queue`` once what runs
        (``running``) ends (:func:`agent.policy.forecast.forecast`): its node, a gang's every
        member's; empty: no forecast."""
        ...

    def rebind(self, spec: JobSpec, node: Node, keys: tuple[str, ...]) -> tuple[str, ...] | None:
        """Asked by a runner whose devices ``keys`` an offer (or a gang's prepare: its member)
        named are taken meanwhile: the devices of the same models this placement would give the
        job, or the gang's member, on ``node`` (the runner's own, as it is now) instead;
        ``None``: none fit."""
        ...


def _job(spec: JobSpec, owner: str | None = None) -> Job:
    """The job as the policy sees it (a gang with all its nodes)."""
    return adapt.job_from_spec("", spec, owner=owner)


def _member(spec: JobSpec) -> JobSpec:
    """The job as one node's part of it: a gang's member (itself when it is no gang)."""
    if spec.resources.nodes <= 1:
        return spec
    return replace(spec, resources=replace(spec.resources, nodes=1))


def _sets(placements: Sequence[PolicyPlacement]) -> list[GangSet]:
    return [
        tuple(Candidate(n, d) for n, d in zip(p.node_ids, p.devices, strict=True))
        for p in placements
        if p.node_ids
    ]


class _Held:
    """The devices of recent offers, counted in use (:mod:`agent.owning.recentoffers`)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._recent = RecentOffers()
        self._memo = adapt.NodeMemo()
        self._records: dict[str, object | None] = {}
        """Each node's status record in the last views placed over (``RecentOffers.held``)."""

    def reserving(self, candidate: Candidate) -> None:
        self._recent.note(candidate.node_id, candidate.devices, self._clock())

    def offered(self, candidate: Candidate) -> None:
        record = self._records.get(candidate.node_id)
        self._recent.note(candidate.node_id, candidate.devices, self._clock(), record)

    def _held(self, views: Sequence[NodeView]) -> dict[str, frozenset[str]]:
        """The devices held now, the views' records in hand."""
        self._records.update((v.node_id, v.status) for v in views)
        return self._recent.held(self._clock(), self._records)

    def released(self, node_id: str, devices: Sequence[str]) -> None:
        self._recent.forget(node_id, devices)

    def _nodes(self, views: Sequence[NodeView]) -> tuple[Node, ...]:
        """The policy's nodes of ``views``, recently offered devices busy."""
        return mark_held(self._memo.nodes(views), self._held(views))

    def likely_nodes(
        self, spec: JobSpec, nodes: Sequence[NodeView], queue: MeshQueue, running: Sequence[Running]
    ) -> tuple[str, ...]:
        return ()  # first fit makes no forecast


def same_models(node: Node, keys: Sequence[str]) -> Node:
    """``node`` with only its devices of the models of ``keys``: the owner chose for those (their
    speed and memory), so a runner that places the job again keeps to them."""
    models = {d.model for d in node.devices if d.key in keys}
    return replace(node, devices=tuple(d for d in node.devices if d.model in models))


class FirstFit(_Held):
    """Hard constraints only; nodes in id order, ``prefer`` first."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)

    def gang_candidates(
        self,
        spec: JobSpec,
        nodes: Sequence[NodeView],
        *,
        exclude: frozenset[str] = frozenset(),
        queue: MeshQueue | None = None,
    ) -> list[GangSet]:
        """First fit, the baseline, keeps no queue order across owners (``queue``)."""
        known = self._nodes([n for n in nodes if n.inventory is not None])
        return _sets(first_fit(_job(spec), known, exclude=exclude))

    def candidates(
        self,
        spec: JobSpec,
        nodes: Sequence[NodeView],
        *,
        exclude: frozenset[str] = frozenset(),
        prefer: str | None = None,
        queue: MeshQueue | None = None,
    ) -> list[Candidate]:
        """First fit, the baseline, keeps no queue order across owners (``queue``)."""
        job = _job(spec)
        known = self._nodes([n for n in nodes if n.inventory is not None])
        return [
            Candidate(p.node_id, p.devices[0])
            for p in first_fit(job, known, exclude=exclude, prefer=prefer)
        ]

    def why_pending(self, spec: JobSpec, queue: MeshQueue | None = None) -> str:
        r = spec.resources
        if spec.lacking:
            return "waits for an agent that runs it: " + lacking_reason(spec.lacking)
        gpus = f"{r.gpus_per_node} free GPU" + "s" * (r.gpus_per_node != 1)
        if r.share_fraction is not None:
            parts = [f"no schedulable node has a {r.share_fraction:g} share of a GPU free"]
        elif r.share_mem_bytes is not None:
            parts = [f"no schedulable node has {r.share_mem_bytes / 1024**3:g} GiB of a GPU free"]
        elif r.nodes > 1:
            parts = [f"no {r.nodes} schedulable nodes have {gpus} each"]
        else:
            parts = [f"no schedulable node has {gpus}"]
        if r.min_mem_per_gpu_bytes is not None:
            parts.append(f"with >= {r.min_mem_per_gpu_bytes / 1024**3:g} GiB")
        if r.backends:
            parts.append(f"and backend {'/'.join(r.backends)}")
        if r.min_compute_capability is not None:
            parts.append(f"and compute capability >= {r.min_compute_capability}")
        if r.archs:
            parts.append(f"and arch {'/'.join(r.archs)}")
        if r.interconnect is not None and r.gpus_per_node > 1:
            parts.append(f"linked by {r.interconnect}")
        if r.os is not None:
            parts.append(f"on OS {r.os}")
        if spec.affinity or spec.anti_affinity:
            parts.append("with the labels it asks for")
        return " ".join(parts)

    def preemption(
        self, spec: JobSpec, nodes: Sequence[NodeView], running: Sequence[Running]
    ) -> Candidate | None:
        """First fit, the baseline, never preempts."""
        return None

    def shrink(
        self, spec: JobSpec, nodes: Sequence[NodeView], running: Sequence[Running]
    ) -> Candidate | None:
        """First fit, the baseline, never shrinks a job."""
        return None

    def reclaim(
        self, job: Job, nodes: Sequence[NodeView], running: Sequence[Running], teams: Teams
    ) -> Candidate | None:
        """First fit, the baseline, never preempts."""
        return None

    def rebind(self, spec: JobSpec, node: Node, keys: tuple[str, ...]) -> tuple[str, ...] | None:
        placed = first_fit(_job(_member(spec)), [same_models(node, keys)], limit=1)
        return placed[0].devices[0] if placed else None


class ShoalPlacement(_Held):
    """The Shoal policy behind the owner's seam (see the module doc)."""

    def __init__(
        self,
        model: ThroughputModel | None = None,
        config: PolicyConfig | None = None,
        *,
        owner: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(clock)
        self.model = model or ThroughputModel()
        self.config = config or PolicyConfig()
        self.owner = owner
        self._state = PolicyState()
        self._snapshot = Snapshot(now=0.0, nodes=())
        self._queue_state = PolicyState()
        self._queue_config = replace(self.config, preemption=False, time_slice=(), moves=False)
        """The pass behind the mesh's queue: it only places (preemption and shrinking are asked
        for apart, when nothing fits; the live mesh neither slices time nor moves jobs)."""
        self._waiting: tuple[str, str] | None = None
        """The last job the queue held back, and the policy's line for it."""
        self._pass: tuple[Hashable, Decisions] | None = None
        """The last decision pass behind the mesh's queue, and what it was run for: the view's
        generation, its jobs, this owner's held offers and the second (``_behind``)."""
        gavel.load()

    def _context(self, nodes: Sequence[NodeView]) -> Snapshot:
        views = [n for n in nodes if n.inventory is not None]
        self._snapshot = Snapshot(
            now=self._clock(),
            nodes=self._nodes(views),
            dataset_bytes=adapt.dataset_bytes(views),
            dataset_newest=adapt.dataset_newest(views),
        )
        return self._snapshot

    def _ranked(
        self,
        spec: JobSpec,
        nodes: Sequence[NodeView],
        exclude: frozenset[str],
        queue: MeshQueue | None = None,
    ) -> list[PolicyPlacement]:
        """The policy's placements of the job over the live ``nodes``, best first (a gang:
        whole sets); behind ``queue``'s jobs ahead when there are any. A job moved away from a
        node (``exclude``) is placed on its own: the operator asked for it."""
        self._waiting = None
        if queue is not None and (queue.ahead or queue.teams is not None) and not exclude:
            return self._behind(queue, nodes)
        snapshot = self._context(nodes)
        ctx, _ = context(snapshot, self.model, self.config, state=self._state, owner=self.owner)
        job = _job(spec, self.owner)
        ranked = rank_any(job, ctx, limit=self.config.alternates + 1, exclude=exclude)
        return [c.placement for c in ranked]

    def _behind(self, queue: MeshQueue, nodes: Sequence[NodeView]) -> list[PolicyPlacement]:
        """The policy's decision pass over the jobs ahead and this one
        (:mod:`agent.owning.meshqueue`): where it starts now, if it does, and the alternates; else
        none, and why."""
        now = self._clock()
        held = self._held(nodes)
        key = None
        if queue.generation is not None:  # one pass for every job in it, while nothing changes
            ids = tuple(j.job_id for j in queue.jobs)
            marks = frozenset((n, frozenset(keys)) for n, keys in held.items())
            key = (queue.generation, ids, marks, int(now))
        if key is not None and self._pass is not None and self._pass[0] == key:
            decisions = self._pass[1]
        else:
            views = [n for n in nodes if n.inventory is not None]
            busy = adapt.nodes_from_views(views, adapt.holders(queue.running))
            snapshot = Snapshot(
                now=now,
                nodes=mark_held(busy, held),
                pending=queue.jobs,
                running=queue.running,
                dataset_bytes=adapt.dataset_bytes(views),
                dataset_newest=adapt.dataset_newest(views),
                teams=queue.teams,
            )
            self._snapshot = snapshot
            decisions = decide(
                snapshot, self.model, self._queue_config, state=self._queue_state, owner=self.owner
            )
            self._pass = (key, decisions) if key is not None else None
        job_id = queue.job.job_id
        found = decisions.assignment(job_id)
        if found is None or found.after:
            line = decisions.waiting_line(job_id)
            self._waiting = (job_id, line) if line is not None else None
            return []
        return [found.placement, *found.alternates][: self.config.alternates + 1]

    def gang_candidates(
        self,
        spec: JobSpec,
        nodes: Sequence[NodeView],
        *,
        exclude: frozenset[str] = frozenset(),
        queue: MeshQueue | None = None,
    ) -> list[GangSet]:
        return _sets(self._ranked(spec, nodes, exclude, queue))

    def candidates(
        self,
        spec: JobSpec,
        nodes: Sequence[NodeView],
        *,
        exclude: frozenset[str] = frozenset(),
        prefer: str | None = None,
        queue: MeshQueue | None = None,
    ) -> list[Candidate]:
        if prefer is not None:
            queue = None  # moved to a named node: the operator asked for it
        placed = self._ranked(spec, nodes, exclude, queue)
        out = [Candidate(p.node_id, p.devices[0]) for p in placed]
        if prefer is not None:
            out.sort(key=lambda c: c.node_id != prefer)
        return out

    def likely_nodes(
        self, spec: JobSpec, nodes: Sequence[NodeView], queue: MeshQueue, running: Sequence[Running]
    ) -> tuple[str, ...]:
        views = [n for n in nodes if n.inventory is not None]
        snapshot = Snapshot(
            now=self._clock(),
            nodes=adapt.nodes_from_views(views, adapt.holders(running)),
            pending=queue.jobs,
            running=tuple(running),
            dataset_bytes=adapt.dataset_bytes(views),
            dataset_newest=adapt.dataset_newest(views),
        )
        decisions = decide(
            snapshot, self.model, self._queue_config, owner=self.owner, forecasts=True
        )
        found = decisions.forecasts.get(queue.job.job_id)
        return () if found is None or found.start_p50 == math.inf else found.node_ids

    def rebind(self, spec: JobSpec, node: Node, keys: tuple[str, ...]) -> tuple[str, ...] | None:
        snapshot = Snapshot(now=self._clock(), nodes=(same_models(node, keys),))
        ctx, _ = context(snapshot, self.model, self.config, owner=self.owner)
        found = rank_any(_job(_member(spec), self.owner), ctx, limit=1)
        return found[0].placement.devices[0] if found else None

    def why_pending(self, spec: JobSpec, queue: MeshQueue | None = None) -> str:
        if queue is not None and self._waiting is not None:
            job_id, line = self._waiting
            if job_id == queue.job.job_id:
                return line
        ctx, state = context(
            self._snapshot, self.model, self.config, state=self._state, owner=self.owner
        )
        job = _job(spec, self.owner)
        return never_reason(job, ctx, state) or busy_line(job, 0, None, None)

    def preemption(
        self, spec: JobSpec, nodes: Sequence[NodeView], running: Sequence[Running]
    ) -> Candidate | None:
        """The policy's cheapest legal preemption for the job over the live ``nodes``. Only
        a higher priority preempts here: time slicing is off on the live mesh (a runner
        refuses to stop a job of equal priority, whatever an offer says)."""
        if not any(r.job.preemptible and r.job.priority < spec.priority for r in running):
            return None  # nothing it may stop: no index built for nothing
        ctx, by_node = self._running_context(nodes, running)
        found = preempt_for(_job(spec, self.owner), ctx, by_node)
        if found is None:
            return None
        node_id, keys = found.placement.node_id, found.placement.devices[0]
        # Only what frees a device the job takes: a runner refuses a victim that frees none.
        held = {r.job.job_id: set(r.placement.devices[0]) for r in by_node[node_id]}
        victims = tuple(v for v in found.victims if held.get(v, set()) & set(keys))
        return Candidate(node_id, keys, victims) if victims else None

    def shrink(
        self, spec: JobSpec, nodes: Sequence[NodeView], running: Sequence[Running]
    ) -> Candidate | None:
        """The policy's shrink of elastic jobs for the job (:func:`~agent.policy.shrink.
        shrink_for`), over the live ``nodes``; no priority is needed."""
        if not any(spare_gpus(r) for r in running):
            return None
        ctx, by_node = self._running_context(nodes, running)
        found = shrink_for(_job(spec, self.owner), ctx, by_node)
        if found is None:
            return None
        return Candidate(found.placement.node_id, found.placement.devices[0], shrink=found.victims)

    def reclaim(
        self, job: Job, nodes: Sequence[NodeView], running: Sequence[Running], teams: Teams
    ) -> Candidate | None:
        """The policy's reclaim for ``job`` (:func:`agent.policy.decision.decide` over it alone:
        its team under its guarantee stops other teams' borrowed, preemptible jobs, whatever
        their priority, or frees one node by the guarantee plan: reclaims there and moves the
        other movable jobs off it onto GPUs idle now); the runner counts again before it stops
        or moves anyone."""
        if not job.team or not Ledger(teams, running).below_guarantee(job):
            return None
        views = [n for n in nodes if n.inventory is not None]
        snapshot = Snapshot(
            now=self._clock(),
            nodes=adapt.nodes_from_views(views, adapt.holders(running)),
            pending=(job,),
            running=tuple(running),
            dataset_bytes=adapt.dataset_bytes(views),
            dataset_newest=adapt.dataset_newest(views),
            teams=teams,
        )
        # Moves only for the guarantee plan, on one node: none for speed (the live mesh moves no
        # job for that), none needing another runner, none of a job that is not preemptible
        # before it saved a checkpoint (its runner would refuse it).
        config = replace(
            self.config,
            preemption=True,
            time_slice=(),
            move_min_gain_s=math.inf,
            guarantee_one_node=True,
            moves_keep_work=True,
        )
        found = decide(snapshot, self.model, config, owner=self.owner, explain=False)
        start = found.assignment(job.job_id)
        if start is None or not start.after or len(start.placement.node_ids) != 1:
            return None
        node_id, keys = start.placement.node_id, start.placement.devices[0]
        moved = {m.job_id for m in found.moves}
        held = {r.job.job_id: set(r.placement.devices[0]) for r in running}
        frees = [v for v in start.after if held.get(v, set()) & set(keys)]
        victims = tuple(v for v in frees if v not in moved)
        moves = tuple(v for v in frees if v in moved)
        return Candidate(node_id, keys, victims, moves=moves) if frees else None

    def _running_context(
        self, nodes: Sequence[NodeView], running: Sequence[Running]
    ) -> tuple[Context, dict[str, list[Running]]]:
        """A pass's context over the live ``nodes`` with what ``running`` holds, and the
        running jobs by node (time slicing off: the live mesh does not slice)."""
        views = [n for n in nodes if n.inventory is not None]
        snapshot = Snapshot(
            now=self._clock(),
            nodes=adapt.nodes_from_views(views, adapt.holders(running)),
            running=tuple(running),
            dataset_bytes=adapt.dataset_bytes(views),
            dataset_newest=adapt.dataset_newest(views),
        )
        config = replace(self.config, time_slice=())
        ctx, _ = context(snapshot, self.model, config, owner=self.owner)
        by_node: dict[str, list[Running]] = {}
        for r in running:
            by_node.setdefault(r.placement.node_id, []).append(r)
        return ctx, by_node


PLACEMENTS: dict[str, Callable[[str | None, float, str], Placement]] = {
    "fifo": lambda owner, min_run_s, objective: FirstFit(),
    "shoal": lambda owner, min_run_s, objective: ShoalPlacement(
        owner=owner,
        config=PolicyConfig(min_run_s=min_run_s, objective=objective_of(objective)),
    ),
}
"""Placement by the name an agent's config gives (``placement = "fifo"``), for an owner, with
the minimum run time before a job may be preempted (``preempt_min_run_s``) and the policy's
objective (``objective``; first fit has none)."""


def objective_of(name: str) -> Objective:
    """The policy's objective named ``name`` (``ValueError`` for another)."""
    for objective in OBJECTIVES:
        if objective == name:
            return objective
    raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, not {name!r}")
