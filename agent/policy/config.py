"""The policy's one configuration: what it optimizes and how much each score term weighs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agent.policy.snapshot import JobKind

Objective = Literal["performance", "energy", "cost", "packing"]
OBJECTIVES: tuple[Objective, ...] = ("performance", "energy", "cost", "packing")


@dataclass(frozen=True, slots=True)
class Weights:
    """How much each score term counts (see :mod:`agent.policy.scoring`)."""

    speed: float = 1.0
    """Per unit of log speed: a device twice as fast for this job scores +0.69."""
    fragmentation: float = 0.4
    """Per GPU of capacity the placement leaves unusable to the workload's shapes (FGD)."""
    link: float = 0.3
    """A multi-GPU job whose GPUs share a fast link (NVLink, xGMI) when it did not require one."""
    data: float = 1.0
    """The time moving its datasets would take, as a fraction of its run (capped at 1)."""
    heat: float = 0.5
    """A GPU within ``heat_margin_c`` of its slowdown temperature (at it: the whole weight)."""
    power: float = 0.2
    """A GPU drawing within 10% of its power limit."""
    objective: float = 1.0
    """Per unit of log watts (``energy``) or log cost per hour (``cost``), taken away: at 1.0,
    with ``speed``, the score ranks by performance per watt or per unit of cost."""
    zone: float = 0.5
    """A gang spread over more than one zone."""
    rtt: float = 0.5
    """A gang's largest RTT between members, per 10 ms."""
    spread: float = 0.01
    """Ties between owners broken apart, so two owners do not offer to the same node."""
    packing: float = 0.02
    """Per GPU left free on the node by the placement, taken away, under the ``packing``
    objective: of two places that leave the workload the same room, the fuller node. Small
    beside ``fragmentation``: a node seven GPUs emptier weighs 0.14, no more than the room a
    GPU of a model that 35% of the workload needs (at 0.05 the fuller node took the last GPUs
    that model-bound jobs needed)."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Everything the policy can be told. One documented field each."""

    objective: Objective = "performance"
    """``energy``: inference jobs prefer performance per watt; ``cost``: every job prefers
    performance per unit of the node's cost per hour; ``packing``: as many jobs placed as the
    fleet can hold, speed not weighed (a fleet kept full of services, FGD's setting): the place
    that leaves the workload's shapes the most room, then the fullest node."""
    efficient_kinds: tuple[JobKind, ...] = ("inference",)
    """Job kinds whose fastest device is not needed (a service runs until stopped: a faster GPU
    does not end it sooner): placed by performance per watt under the ``performance`` objective
    too. Empty: only the ``energy`` objective weighs watts."""
    weights: Weights = field(default_factory=Weights)
    backfill: bool = True
    """EASY backfill: a job may start ahead of the first blocked one when it does not delay it."""
    preemption: bool = True
    time_slice: tuple[float, ...] = (3600.0, 36_000.0, 360_000.0)
    """Least attained service among preemptible jobs of one priority (Tiresias's discretized
    LAS): the GPU-seconds that end each service level (1, 10 and 100 GPU-hours). A job waits
    behind the jobs of its priority at a lower level, and one at a lower level may take the GPUs
    of a preemptible job of the same priority at a higher level (past ``min_run_s``). Empty: only
    a higher priority preempts, and the queue orders by age after priority and deadline."""
    preempt_tries: int = 8
    """Jobs that look for victims in one pass, at most (the first that cannot start)."""
    min_run_s: float = 600.0
    """A job runs at least this long (since it started or last moved) before it may be preempted
    or moved: the guard against preemption loops."""
    moves: bool = True
    """Move a running job to an idle device where it finishes sooner by enough."""
    move_min_gain_s: float = 1800.0
    move_min_gain_fraction: float = 0.25
    """A move must save at least this long and this fraction of the job's remaining time."""
    move_cost_s: float = 60.0
    """What a move costs a job: checkpoint, transfer, restart."""
    max_moves: int = 4
    """Moves decided in one pass, at most."""
    defrag_max_moves: int = 4
    """Jobs moved off one node, at most, to make room there for a job that needs several of its
    GPUs (:mod:`agent.policy.defrag`); 0: never."""
    guarantee_one_node: bool = False
    """A team's guarantee plan (:mod:`agent.policy.guarantee`) stops and moves only jobs on the
    node it frees, and moves them only onto GPUs idle now: the live mesh, where that node's
    runner alone carries the plan out."""
    moves_keep_work: bool = False
    """A job that is not preemptible moves only once it has saved a checkpoint
    (``Running.last_checkpoint_at``), so a move loses no more than the work since: the live
    mesh, whose runners refuse any other move (``agent.running.preemption``)."""
    defrag_hold_s: float = 600.0
    """How long a node emptied for a waiting job is held for it, and no new plan is made for
    that job meanwhile."""
    swap_ratio: float = 1.5
    """A job starting on a fast device yields it to a running job on a slower one when the
    running job's speedup there is this many times the starter's."""
    heat_margin_c: float = 10.0
    scan_per_group: int = 8
    """Nodes looked at in each group of interchangeable nodes (dataset holders always)."""
    alternates: int = 4
    """Candidates kept after the best one, tried in turn when a node declines."""
    batch_limit: int = 64
    """Jobs starting in one pass reordered by who gains most from a fast device, at most."""
    gang_rtt_limit_s: float = 0.05
    """Members of a gang further apart than this are not put together."""
