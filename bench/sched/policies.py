"""The policies the simulated mesh runs, each through the functions the agents themselves call.

- ``shoal``: :func:`agent.policy.decision.decide`, the whole Shoal policy; every owner decides on
  the lagging view and acts on its own jobs.
- ``fifo``: what :class:`agent.owning.placement.FirstFit` does in the mesh: every owner, on its own,
  offers its jobs (priority, deadline, age) to the first node in id order that fits
  (:func:`agent.policy.baselines.first_fit`), heterogeneity-agnostic, no reservations.
- ``backfill``: EASY backfill with first-fit placement, central (a fresh view): jobs in queue
  order, the first that waits holds a reservation that later jobs may only backfill around.
- ``bestfit`` (openb): FGD's BestFit baseline, central (:func:`agent.policy.baselines.best_fit`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence

from agent.policy import apply
from agent.policy.baselines import best_fit, best_fit_on, first_fit, pick
from agent.policy.config import PolicyConfig
from agent.policy.context import Context, req_key
from agent.policy.decision import Decisions, context, decide
from agent.policy.forecast import _Duration, _Timeline, remaining_s
from agent.policy.index import Group
from agent.policy.place import could_fit_now
from agent.policy.queue import Reservation, order_key, queue_order
from agent.policy.snapshot import Job, Node, Placement, Running, Snapshot
from agent.policy.state import PolicyState
from bench.sched.engine import Simulation
from bench.sched.simtypes import MoveOrder, Plan, Start


class ShoalMesh:
    name = "shoal"
    central = False

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()
        self.state = PolicyState()
        self.stale_state = PolicyState()
        self._seen: deque[tuple[float, tuple[Node, ...], tuple[Running, ...]]] = deque()

    def plan(self, snapshot: Snapshot, sim: Simulation) -> Plan:
        d = decide(snapshot, sim.model, self.config, state=self.state, explain=False)
        lag = sim.config.view_lag_s
        if lag <= 0:
            return _plan_of(d)
        stale = self._stale_view(snapshot, lag)
        old = decide(stale, sim.model, self.config, state=self.stale_state, explain=False)
        return _plan_of(d, lambda job_id: not _lags(sim, job_id), old)

    def _stale_view(self, snapshot: Snapshot, lag_s: float) -> Snapshot:
        """The snapshot as the lagging owners see it: nodes and running jobs of the newest pass
        at least ``lag_s`` old (a job waiting now is not shown running)."""
        seen = self._seen
        seen.append((snapshot.now, snapshot.nodes, snapshot.running))
        while len(seen) > 1 and seen[1][0] <= snapshot.now - lag_s:
            seen.popleft()
        _at, nodes, running = seen[0]
        waiting = {j.job_id for j in snapshot.pending}
        running = tuple(r for r in running if r.job.job_id not in waiting)
        return dataclasses.replace(snapshot, nodes=nodes, running=running)


def _lags(sim: Simulation, job_id: str) -> bool:
    """Whether the job's owner is one of those whose view lags (``SimConfig.view_lag_s``)."""
    sj = sim.jobs.get(job_id)
    return sj is not None and int(sj.owner.rsplit("-", 1)[-1]) % 2 == 1


def _plan_of(
    d: Decisions, fresh: Callable[[str], bool] | None = None, old: Decisions | None = None
) -> Plan:
    """What the owners act on: each its own jobs' decisions, from its own view (``fresh``:
    whether a job's owner decided from ``d``, the others from ``old``)."""
    picks = [d] if fresh is None or old is None else [d, old]
    keep = [(x, i == 0) for i, x in enumerate(picks)]

    def mine(job_id: str, first: bool) -> bool:
        return fresh is None or fresh(job_id) == first

    return Plan(
        starts=tuple(
            Start(a.job_id, (a.placement, *a.alternates), a.after)
            for x, first in keep
            for a in x.assignments
            if mine(a.job_id, first)
        ),
        moves=tuple(
            MoveOrder(m.job_id, m.placement, m.after)
            for x, first in keep
            for m in x.moves
            if mine(m.job_id, first)
        ),
        stops=tuple(
            v
            for x, first in keep
            for p in x.preemptions
            if mine(p.job_id, first)
            for v in p.victims
        ),
    )


def _clashes(placement: Placement, offered: set[tuple[str, str]]) -> bool:
    return (
        any(
            (node_id, key) in offered
            for node_id, keys in zip(placement.node_ids, placement.devices, strict=True)
            for key in keys
        )
        and not placement.share_mem_bytes
    )


def _room_in(job: Job, group: Group) -> bool:
    """Whether a node of ``group`` has the room ``job`` needs now, by the index's counts (idle
    GPUs, share room, free CPU and memory): a necessary condition of :func:`first_fit` and
    :func:`best_fit` placing it there, so handing them only such nodes changes nothing they
    decide and spares them the nodes that are full (most of them, late in a fill)."""
    if job.cpu_milli and group.cpu_free is not None and group.cpu_free < job.cpu_milli:
        return False
    if job.host_mem_bytes and group.mem_free is not None and group.mem_free < job.host_mem_bytes:
        return False
    if job.gpus_per_node == 0:
        return True
    if job.is_share:
        return any(room > 0 for room in group.share_free.values())
    return sum(group.whole_free.values()) >= job.gpus_per_node


def _may_fit(job: Job, ctx: Context) -> list[Node]:
    """The schedulable nodes with room for ``job`` now (:func:`_room_in`)."""
    entries = ctx.index.entries
    return [
        entries[node_id].node
        for group in ctx.index.groups.values()
        if _room_in(job, group)
        for node_id in group.members
    ]


def _requirements(job: Job) -> tuple[object, ...]:
    """Everything :func:`pick` and :func:`best_fit_on` read of a job."""
    return (
        req_key(job),
        job.os,
        job.features,
        tuple(sorted(job.affinity.items())),
        tuple(sorted(job.anti_affinity.items())),
        job.max_cost_per_hour,
    )


class _NodeMemo:
    """:func:`pick` and :func:`best_fit_on` by job requirements and node, kept across passes:
    a node's answer is asked again only once its record changed (snapshots are immutable, so an
    unchanged node is the same object). A trace has few distinct requirements (openb's default
    list: 162), so after the first passes nearly every answer is held."""

    def __init__(self) -> None:
        self._picks: dict[tuple[tuple[object, ...], str], tuple[Node, Placement | None]] = {}
        self._best: dict[
            tuple[tuple[object, ...], str], tuple[Node, tuple[float, Placement] | None]
        ] = {}
        self._reqs: dict[str, tuple[Job, tuple[object, ...]]] = {}

    def _key(self, job: Job, node: Node) -> tuple[tuple[object, ...], str]:
        held = self._reqs.get(job.job_id)
        if held is None or held[0] is not job:
            held = self._reqs[job.job_id] = (job, _requirements(job))
        return (held[1], node.node_id)

    def pick(self, job: Job, node: Node) -> Placement | None:
        key = self._key(job, node)
        held = self._picks.get(key)
        if held is not None and held[0] is node:
            return held[1]
        value = pick(job, node)
        if len(self._picks) > 1_000_000:
            self._picks.clear()
        self._picks[key] = (node, value)
        return value

    def best_fit_on(self, job: Job, node: Node) -> tuple[float, Placement] | None:
        key = self._key(job, node)
        held = self._best.get(key)
        if held is not None and held[0] is node:
            return held[1]
        value = best_fit_on(job, node)
        if len(self._best) > 1_000_000:
            self._best.clear()
        self._best[key] = (node, value)
        return value


def _room_key(job: Job) -> tuple[int, int, int, bool]:
    """What :func:`_room_in` reads of a job."""
    return (job.cpu_milli, job.host_mem_bytes, job.gpus_per_node, job.is_share)


def _with_room(job: Job, ctx: Context, by_id: Sequence[tuple[str, Group]]) -> list[str]:
    """The ids, in id order, of the nodes with room for ``job`` (:func:`_room_in`);
    ``by_id``: every schedulable node's id and group, in id order."""
    room = {group.serial: _room_in(job, group) for group in ctx.index.groups.values()}
    return [node_id for node_id, group in by_id if room[group.serial]]


def _first_fit(
    job: Job, ctx: Context, with_room: Sequence[str], limit: int, memo: _NodeMemo
) -> list[Placement]:
    """``first_fit(job, nodes, limit=limit)`` over every node, asked of the nodes with room
    (``with_room``, in id order) a few at a time until ``limit`` fit: the same answer, without
    sorting the fleet and asking every node for every job."""
    entries = ctx.index.entries
    if job.is_gang:
        nodes = [entries[node_id].node for node_id in with_room]
        return first_fit(job, nodes, limit=limit, picker=memo.pick)
    out: list[Placement] = []
    for at in range(0, len(with_room), 32):
        chunk = [entries[node_id].node for node_id in with_room[at : at + 32]]
        out.extend(first_fit(job, chunk, limit=limit - len(out), picker=memo.pick))
        if len(out) >= limit:
            break
    return out


class FifoMesh:
    name = "fifo"
    central = False

    def __init__(self) -> None:
        self.state = PolicyState()
        self.memo = _NodeMemo()

    def plan(self, snapshot: Snapshot, sim: Simulation) -> Plan:
        ctx, _ = context(snapshot, sim.model, state=self.state)
        entries = ctx.index.entries
        by_id = [
            (node_id, group)
            for node_id in sorted(entries)
            if (group := entries[node_id].group) is not None
        ]
        with_room: dict[tuple[int, int, int, bool], list[str]] = {}
        by_owner: dict[str, list[Job]] = {}
        for job in snapshot.pending:
            by_owner.setdefault(job.owner or "", []).append(job)
        starts: list[Start] = []
        for owner in sorted(by_owner):
            offered: set[tuple[str, str]] = set()
            for job in sorted(by_owner[owner], key=order_key):
                if not could_fit_now(job, ctx):
                    continue
                room = _room_key(job)
                ids = with_room.get(room)
                if ids is None:
                    ids = with_room[room] = _with_room(job, ctx, by_id)
                cands = [
                    p for p in _first_fit(job, ctx, ids, 6, self.memo) if not _clashes(p, offered)
                ]
                if not cands:
                    continue
                starts.append(Start(job.job_id, tuple(cands[:4])))
                for node_id, keys in zip(cands[0].node_ids, cands[0].devices, strict=True):
                    offered.update((node_id, k) for k in keys)
        return Plan(starts=tuple(starts))


class BackfillCentral:
    name = "backfill"
    central = True

    def __init__(self) -> None:
        self.state = PolicyState()

    def plan(self, snapshot: Snapshot, sim: Simulation) -> Plan:
        ctx, _ = context(snapshot, sim.model, state=self.state)
        now = snapshot.now
        reservation: Reservation | None = None
        starts: list[Start] = []
        started: list[tuple[Job, float]] = []
        for job in queue_order(snapshot.pending):
            if not could_fit_now(job, ctx):
                if reservation is None:
                    reservation = self._reserve(job, ctx, started)
                continue
            nodes = ctx.index.nodes()
            cands = first_fit(job, sorted(nodes, key=lambda n: n.node_id), limit=4)
            if reservation is not None:
                end90 = now + ctx.duration_s(job, 1.0)[1]
                cands = [c for c in cands if reservation.allows(c.node_ids, end90)]
            if not cands:
                if reservation is None:
                    reservation = self._reserve(job, ctx, started)
                continue
            apply.take(ctx.index, job, cands[0])
            starts.append(Start(job.job_id, tuple(cands)))
            started.append((job, now + ctx.duration_s(job, 1.0)[0]))
        return Plan(starts=tuple(starts))

    @staticmethod
    def _reserve(job: Job, ctx: object, started: Sequence[tuple[Job, float]]) -> Reservation | None:
        from agent.policy.context import Context

        assert isinstance(ctx, Context)
        now = ctx.snapshot.now
        ends = {r.job.job_id: now + remaining_s(r, ctx)[0] for r in ctx.snapshot.running}
        ends.update((j.job_id, end) for j, end in started)
        placed = _Timeline(ctx, ends).place(job, _Duration(ctx, 0))
        if placed is None:
            return None
        return Reservation(job.job_id, placed[2], placed[0])


class BestFitCentral:
    name = "bestfit"
    central = True

    def __init__(self) -> None:
        self.state = PolicyState()
        self.memo = _NodeMemo()

    def plan(self, snapshot: Snapshot, sim: Simulation) -> Plan:
        ctx, _ = context(snapshot, sim.model, state=self.state)
        starts: list[Start] = []
        for job in queue_order(snapshot.pending):
            if not could_fit_now(job, ctx):
                continue
            cands = best_fit(job, _may_fit(job, ctx), fitter=self.memo.best_fit_on)
            if cands:
                apply.take(ctx.index, job, cands[0])
                starts.append(Start(job.job_id, tuple(cands[:4])))
        return Plan(starts=tuple(starts))
