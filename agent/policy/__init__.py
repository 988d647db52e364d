"""Shoal's scheduling policy: one pure function from a snapshot of the fleet to every decision.

No asyncio, no clock, no I/O: ``now`` is in the :class:`~agent.policy.snapshot.Snapshot`, as the
gossip core takes it (``gossip/peer.py``). The agents' owners (:mod:`agent.owning.placement`), the
TUI's previews (:mod:`agent.policy.preview`) and the simulator of ``python -m bench.sched`` all call
these same functions.

Modules, each named for what it holds:

- :mod:`~agent.policy.snapshot` the input types; :mod:`~agent.policy.adapt` builds them from
  what agents and the TUI hold today;
- :mod:`~agent.policy.filters` hard filters; :mod:`~agent.policy.index` free capacity grouped;
- :mod:`~agent.policy.prior`, :mod:`~agent.policy.gavel`, :mod:`~agent.policy.model` the
  throughput model (catalog, Gavel's matrix, learning from reported rates);
- :mod:`~agent.policy.scoring` score terms; :mod:`~agent.policy.fragmentation` FGD's measure;
- :mod:`~agent.policy.place` single-node candidates (whole GPUs, shares), :mod:`~agent.policy.gangs`
  all-or-nothing sets;
- :mod:`~agent.policy.queue` order and EASY backfill, :mod:`~agent.policy.preempt` victims,
  :mod:`~agent.policy.moves` moves and swaps, :mod:`~agent.policy.forecast` p50/p90 times,
  :mod:`~agent.policy.explain` "why waiting", :mod:`~agent.policy.submit` the submission answer;
- :mod:`~agent.policy.decision` one pass over all of it; :mod:`~agent.policy.baselines` first fit
  and best fit, the placements Shoal is compared with.
"""

from __future__ import annotations

from agent.policy.config import PolicyConfig, Weights
from agent.policy.decision import Assignment, Decisions, Waiting, context, decide, rank_any
from agent.policy.forecast import Forecast
from agent.policy.model import ThroughputModel
from agent.policy.moves import Move
from agent.policy.preempt import Preemption
from agent.policy.queue import Reservation, queue_order
from agent.policy.snapshot import Device, Job, Node, Placement, Running, Share, Snapshot
from agent.policy.state import PolicyState
from agent.policy.submit import SubmissionCheck, check_submission

__all__ = [
    "Assignment",
    "Decisions",
    "Device",
    "Forecast",
    "Job",
    "Move",
    "Node",
    "Placement",
    "PolicyConfig",
    "PolicyState",
    "Preemption",
    "Reservation",
    "Running",
    "Share",
    "Snapshot",
    "SubmissionCheck",
    "ThroughputModel",
    "Waiting",
    "Weights",
    "check_submission",
    "context",
    "decide",
    "queue_order",
    "rank_any",
]
