"""Where a job may run: the ``Placement`` seam the owner asks, with first fit and the Shoal policy
behind it.

The owner asks a ``Placement`` for an ordered list of candidates (node and device keys) from its
gossip view; it then offers the job to each in turn, and the node admits or declines against its
real local state. Both apply the hard filters, first among them the job-spec features the node's
agent runs. When no node fits, :meth:`Placement.why_pending` says what the job waits for, in one
line. The owner tells the placement of each offer a runner started or declined
(:meth:`Placement.offered`): both count those devices in use for a few seconds, until gossip can
have said so (:mod:`agent.recentoffers`). Both turn the view into the policy's snapshot through
:mod:`agent.policy.adapt` and call the policy's own functions:

- :class:`FirstFit` (``placement = "fifo"``): hard filters only, nodes in id order, a preferred
  target first (:func:`agent.policy.baselines.first_fit`), the baseline ``python -m bench.sched``
  calls ``fifo``;
- :class:`ShoalPlacement` (``placement = "shoal"``, the default): the Shoal policy's ranking
  (:func:`agent.policy.decision.rank_any`: speed on each model, fragmentation, data, heat, cost,
  spreading owners apart), and its "why waiting" line (never fits, or waits for busy capacity).

What the live mesh does not do yet (its next step): gangs (no agent runs the ``gang`` feature, so
one is refused at submission), shares of a GPU, preemption, moves, and one queue order across
owners.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from agent.jobspec import JobSpec, lacking_reason
from agent.policy import adapt
from agent.policy.baselines import first_fit
from agent.policy.config import PolicyConfig
from agent.policy.decision import context, rank_any
from agent.policy.explain import busy_line, never_reason
from agent.policy.model import ThroughputModel
from agent.policy.snapshot import Job, Node, Snapshot
from agent.policy.state import PolicyState
from agent.recentoffers import RecentOffers, mark_held
from agent.view import NodeView


@dataclass(frozen=True, slots=True)
class Candidate:
    node_id: str
    devices: tuple[str, ...]
    """Device keys offered to the job on that node (empty for a CPU-only job)."""


class Placement(Protocol):
    def candidates(
        self,
        spec: JobSpec,
        nodes: Sequence[NodeView],
        *,
        exclude: frozenset[str] = frozenset(),
        prefer: str | None = None,
    ) -> list[Candidate]:
        """Nodes that pass the hard filters, best first (``nodes`` are live agents)."""
        ...

    def why_pending(self, spec: JobSpec) -> str:
        """One line saying what the job waits for."""
        ...

    def offered(self, candidate: Candidate) -> None:
        """A runner started or declined an offer of ``candidate``'s devices just now."""
        ...


def _job(spec: JobSpec, owner: str | None = None) -> Job:
    """The job as the policy sees it, on one node: the live mesh places a gang's first member
    only (no agent runs the ``gang`` feature yet, which the filters check)."""
    job = adapt.job_from_spec("", spec, owner=owner)
    return job if job.nodes == 1 else replace(job, nodes=1)


class _Held:
    """The devices of recent offers, counted in use (:mod:`agent.recentoffers`)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._recent = RecentOffers()

    def offered(self, candidate: Candidate) -> None:
        self._recent.note(candidate.node_id, candidate.devices, self._clock())

    def _nodes(self, views: Sequence[NodeView]) -> tuple[Node, ...]:
        """The policy's nodes of ``views``, recently offered devices busy."""
        return mark_held(adapt.nodes_from_views(views), self._recent.held(self._clock()))


class FirstFit(_Held):
    """Hard constraints only; nodes in id order, ``prefer`` first."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)

    def candidates(
        self,
        spec: JobSpec,
        nodes: Sequence[NodeView],
        *,
        exclude: frozenset[str] = frozenset(),
        prefer: str | None = None,
    ) -> list[Candidate]:
        job = _job(spec)
        known = self._nodes([n for n in nodes if n.inventory is not None])
        return [
            Candidate(p.node_id, p.devices[0])
            for p in first_fit(job, known, exclude=exclude, prefer=prefer)
        ]

    def why_pending(self, spec: JobSpec) -> str:
        r = spec.resources
        if spec.features:
            return "waits for an agent that runs it: " + lacking_reason(spec.features)
        parts = [
            f"no schedulable node has {r.gpus_per_node} free GPU" + "s" * (r.gpus_per_node != 1)
        ]
        if r.min_mem_per_gpu_bytes is not None:
            parts.append(f"with >= {r.min_mem_per_gpu_bytes / 1024**3:g} GiB")
        if r.backends:
            parts.append(f"and backend {'/'.join(r.backends)}")
        if r.min_compute_capability is not None:
            parts.append(f"and compute capability >= {r.min_compute_capability}")
        if r.archs:
            parts.append(f"and arch {'/'.join(r.archs)}")
        return " ".join(parts)


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

    def _context(self, nodes: Sequence[NodeView]) -> Snapshot:
        views = [n for n in nodes if n.inventory is not None]
        self._snapshot = Snapshot(
            now=self._clock(),
            nodes=self._nodes(views),
            dataset_bytes=adapt.dataset_bytes(views),
        )
        return self._snapshot

    def candidates(
        self,
        spec: JobSpec,
        nodes: Sequence[NodeView],
        *,
        exclude: frozenset[str] = frozenset(),
        prefer: str | None = None,
    ) -> list[Candidate]:
        snapshot = self._context(nodes)
        ctx, _ = context(snapshot, self.model, self.config, state=self._state, owner=self.owner)
        job = _job(spec, self.owner)
        ranked = rank_any(job, ctx, limit=self.config.alternates + 1, exclude=exclude)
        out = [Candidate(c.node_id, c.placement.devices[0]) for c in ranked]
        if prefer is not None:
            out.sort(key=lambda c: c.node_id != prefer)
        return out

    def why_pending(self, spec: JobSpec) -> str:
        ctx, state = context(
            self._snapshot, self.model, self.config, state=self._state, owner=self.owner
        )
        job = _job(spec, self.owner)
        return never_reason(job, ctx, state) or busy_line(job, 0, None, None)


PLACEMENTS: dict[str, Callable[[str | None], Placement]] = {
    "fifo": lambda owner: FirstFit(),
    "shoal": lambda owner: ShoalPlacement(owner=owner),
}
"""Placement by the name an agent's config gives (``placement = "fifo"``), for an owner."""
