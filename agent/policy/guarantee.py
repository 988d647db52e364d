"""A team owed its guarantee gets one node freed for its job: reclaim and moves together.

A team below its guarantee whose job needs several GPUs of one node can wait long with every GPU
busy although the fleet owes it: the GPUs other teams borrowed are a few 1- and 2-GPU jobs
scattered over many nodes, so no reclaim frees enough of one node (a reclaim takes back only what
a borrower borrowed), and moving jobs (:mod:`agent.policy.defrag`) needs idle GPUs to move them to.

The plan picks one node and frees the job's GPUs there with both at once: it reclaims borrowed
preemptible jobs on that node, and moves the other movable jobs off it (:func:`movable`) onto
GPUs that are idle elsewhere or that a reclaim elsewhere frees. A borrower is never taken below
its guarantee (the reclaims of one plan count together against what each borrower borrowed), and
a plan moves at most ``PolicyConfig.defrag_max_moves`` jobs. The node freed is the first, by a
lower bound on what freeing it loses (the victims' work since their last checkpoints, each moved
job's since its own), that a plan can free (see :meth:`_Planner.best`). The job starts once the
jobs it waits for have stopped or moved (``after``); a move onto a reclaimed job's GPUs waits for
that job the same way.

Pure and bounded: only the first :data:`SCAN` nodes by that bound are tried (each try applied to
the index and undone if it fails). The simulator's owners use it as above; the live mesh's owners
with ``PolicyConfig.guarantee_one_node``: every job a plan stops or moves runs on the node it
frees, and moves go onto GPUs idle now, so that node's runner alone carries it out
(``agent.owning.placement``, ``agent.running.preemption``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.policy import apply
from agent.policy.context import Context
from agent.policy.filters import host_room
from agent.policy.moves import Move, movable
from agent.policy.place import rank
from agent.policy.preempt import devices_if_freed, fitting_keys, lost_gpu_s
from agent.policy.snapshot import Job, Node, Placement, Running
from agent.policy.state import RunningIndex
from agent.policy.teams import Ledger
from agent.policy.victims import model_at

SCAN = 8
"""Nodes planned in full for one job, at most (the cheapest by their lower bound first)."""
POOL = 64
"""Borrowed jobs elsewhere looked at as room for one moved job, at most (the cheapest first)."""


@dataclass(frozen=True, slots=True)
class Guarantee:
    """Stop ``victims`` and make ``moves`` so that ``job_id`` starts on ``placement`` once
    the jobs of ``after`` (the victims and the moved jobs on its node) are off it."""

    job_id: str
    placement: Placement
    victims: tuple[str, ...]
    moves: tuple[Move, ...]
    after: tuple[str, ...]
    lost_gpu_s: float


def wants_guarantee(job: Job) -> bool:
    """A job of one node that needs several of its whole GPUs."""
    return job.nodes == 1 and job.gpus_per_node >= 2 and not job.is_share and not job.is_elastic


def _gpus(job: Job) -> float:
    return float(max(job.gpus, 0))


def _borrowed_pool(
    job: Job, ctx: Context, jobs: Mapping[str, Running], busy: set[str], ledger: Ledger
) -> tuple[dict[str, float], list[tuple[float, Running]]]:
    """What each borrower may give back, and its preemptible single-node jobs that fit in it,
    cheapest first."""
    budget: dict[str, float] = {}
    pool: list[tuple[float, Running]] = []
    now = ctx.snapshot.now
    for r in jobs.values():
        team = r.job.team
        if not r.job.preemptible or team == job.team or r.job.job_id in busy:
            continue
        if r.job.is_gang or r.job.is_share or len(r.placement.node_ids) != 1:
            continue
        if team not in budget:
            budget[team] = ledger.borrowed(team)
        if _gpus(r.job) <= budget[team] + 1e-9:
            pool.append((lost_gpu_s(r, now), r))
    pool.sort(key=lambda p: (p[0], p[1].job.job_id))
    return budget, pool


@dataclass(slots=True)
class _Try:
    """One node's plan while it is built; every change to the index is kept to undo it."""

    budget: dict[str, float]
    victims: list[Running]
    moves: list[tuple[Running, Placement]]
    freed: set[str]
    lost: float = 0.0
    undo: list[tuple[bool, Job, Placement]] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    """Nodes being freed (the job's, then any a moved job makes room on): no move goes there."""

    def taken(self) -> set[str]:
        return {v.job.job_id for v in self.victims} | {r.job.job_id for r, _ in self.moves}

    def release(self, ctx: Context, r: Running) -> None:
        apply.release(ctx.index, r.job, r.placement)
        self.undo.append((True, r.job, r.placement))

    def take(self, ctx: Context, job: Job, placement: Placement) -> None:
        apply.take(ctx.index, job, placement)
        self.undo.append((False, job, placement))

    def mark(self) -> _Mark:
        n = (len(self.undo), len(self.moves), len(self.victims))
        return _Mark(*n, self.lost, dict(self.budget))

    def undo_to(self, ctx: Context, mark: _Mark) -> None:
        """Back to what it was at ``mark``, the index too."""
        for released, job, placement in reversed(self.undo[mark.undo :]):
            if released:
                apply.take(ctx.index, job, placement)
            else:
                apply.release(ctx.index, job, placement)
        del self.undo[mark.undo :]
        del self.moves[mark.moves :]
        del self.victims[mark.victims :]
        self.lost = mark.lost
        self.budget = dict(mark.budget)

    def rollback(self, ctx: Context) -> None:
        self.undo_to(ctx, _Mark(0, 0, 0, 0.0, self.budget))


@dataclass(frozen=True, slots=True)
class _Mark:
    undo: int
    moves: int
    victims: int
    lost: float
    budget: Mapping[str, float]


def _reclaimable(r: Running, budget: Mapping[str, float]) -> bool:
    return r.job.preemptible and _gpus(r.job) <= budget.get(r.job.team, 0.0) + 1e-9


def _clearable(r: Running, ok: frozenset[str]) -> bool:
    """A job of one node holding some of ``ok``'s devices whole."""
    return (
        len(r.placement.node_ids) == 1
        and not r.placement.share_mem_bytes
        and not set(r.placement.devices[0]).isdisjoint(ok)
    )


class _Planner:
    """What every node's plan for one job shares: the borrowers' budgets and borrowed jobs."""

    def __init__(
        self,
        job: Job,
        ctx: Context,
        running: RunningIndex,
        busy: set[str],
        ledger: Ledger,
        exclude: frozenset[str],
    ) -> None:
        self.job, self.ctx, self.running, self.busy = job, ctx, running, busy
        self.exclude = exclude
        self.now = ctx.snapshot.now
        self.budget, self.pool = _borrowed_pool(job, ctx, running.jobs, busy, ledger)

    def runs_on(self, node_id: str, t: _Try | None = None) -> list[Running]:
        taken = t.taken() if t is not None else set()
        on_node = self.running.by_node.get(node_id, {})
        skip = self.busy | taken
        return [r for r in on_node.values() if r.job.job_id not in skip]

    def lower_bound(self, node: Node) -> tuple[float, list[Running]] | None:
        """What freeing ``node`` loses at least, and the jobs there that could be cleared off
        it, cheapest first (``None``: not enough of them)."""
        job = self.job
        ok = fitting_keys(job, node, self.ctx)
        if ok is None:
            return None
        free = sum(1 for d in node.devices if d.is_free and d.key in ok)
        need = job.gpus_per_node - free
        if need <= 0:
            return None  # it fits already: placement, not this plan, is what it lacks
        clearable = sorted(
            (
                r
                for r in self.runs_on(node.node_id)
                if _clearable(r, ok)
                and (
                    _reclaimable(r, self.budget)
                    or (movable(r, self.ctx) and r.job.gpus < job.gpus_per_node)
                )
            ),
            key=lambda r: (lost_gpu_s(r, self.now), r.job.job_id),
        )
        bound, got = 0.0, 0
        for r in clearable:
            if got >= need:
                break
            bound += lost_gpu_s(r, self.now)
            got += len(set(r.placement.devices[0]) & ok)
        return (bound, clearable) if got >= need else None

    def plan_on(self, node: Node, clearable: list[Running]) -> _Try | None:
        """Free ``node``: reclaim what may be, move the rest; applied to the index (undo with
        :meth:`_Try.rollback`), or ``None`` (nothing left applied)."""
        ok = fitting_keys(self.job, node, self.ctx)
        assert ok is not None
        t = _Try(dict(self.budget), [], [], set(), targets=[node.node_id])
        leaving: list[Job] = []
        for r in clearable:
            if _reclaimable(r, t.budget):
                t.budget[r.job.team] -= _gpus(r.job)
                t.victims.append(r)
                t.lost += lost_gpu_s(r, self.now)
            elif not self.move_off(t, r, node.node_id):
                continue
            t.freed.update(r.placement.devices[0])
            leaving.append(r.job)
            if devices_if_freed(self.job, node, t.freed, {}, ok) is not None and host_room(
                self.job, node, leaving
            ):
                return t
        t.rollback(self.ctx)
        return None

    def move_off(self, t: _Try, r: Running, target: str, *, chain: bool = True) -> bool:
        """Move ``r`` off ``target`` (joins ``t``): onto idle GPUs elsewhere, else onto those a
        reclaim elsewhere frees, else (``chain``) onto a node where moving a smaller job off
        to idle GPUs makes room; only the first with ``guarantee_one_node``."""
        ctx = self.ctx
        if len(t.moves) >= ctx.config.defrag_max_moves or not movable(r, ctx):
            return False
        avoid = self.exclude | {target, *t.targets}
        cands = rank(r.job, ctx, limit=1, exclude=avoid)
        one_node = ctx.config.guarantee_one_node
        dest = cands[0].placement if cands else None
        if dest is None and not one_node:
            dest = self.reclaim_for(t, r, avoid)
        if dest is None and chain and not one_node:
            dest = self.chain_for(t, r, avoid)
        if dest is None:
            return False
        t.take(ctx, r.job, dest)
        t.moves.append((r, dest))
        t.lost += lost_gpu_s(r, self.now) + ctx.config.move_cost_s * _gpus(r.job)
        return True

    def reclaim_for(self, t: _Try, r: Running, avoid: frozenset[str]) -> Placement | None:
        """Room for ``r`` that reclaiming one borrowed job elsewhere frees (it joins ``t``)."""
        chosen = t.taken()
        for cost, v in self.pool[:POOL]:
            other = v.placement.node_id
            if other in avoid or v.job.job_id in chosen or not _reclaimable(v, t.budget):
                continue
            node = self.ctx.index.node(other)
            ok = fitting_keys(r.job, node, self.ctx) if node is not None else None
            if node is None or ok is None:
                continue
            keys = devices_if_freed(r.job, node, set(v.placement.devices[0]), {}, ok)
            if keys is None or not host_room(r.job, node, (v.job,)):
                continue
            t.budget[v.job.team] -= _gpus(v.job)
            t.victims.append(v)
            t.lost += cost
            t.release(self.ctx, v)
            return Placement((other,), (keys,))
        return None

    def chain_for(self, t: _Try, r: Running, avoid: frozenset[str]) -> Placement | None:
        """Room for ``r`` on a node whose idle GPUs fall short: smaller jobs there move off to
        idle GPUs elsewhere first (they join ``t``), the cheapest node first."""
        need_gpus = r.job.gpus_per_node
        options: list[tuple[float, str, list[Running]]] = []
        for group in self.ctx.index.groups.values():
            if not sum(group.whole_free.values()):
                continue
            for node_id in group.members:
                node = self.ctx.index.node(node_id)
                ok = fitting_keys(r.job, node, self.ctx) if node is not None else None
                if node is None or ok is None or node_id in avoid:
                    continue
                free = sum(1 for d in node.devices if d.is_free and d.key in ok)
                if not 0 < free < need_gpus:
                    continue
                small = sorted(
                    (
                        s
                        for s in self.runs_on(node_id, t)
                        if _clearable(s, ok) and s.job.gpus < need_gpus and movable(s, self.ctx)
                    ),
                    key=lambda s: (lost_gpu_s(s, self.now), s.job.job_id),
                )
                cost, got = 0.0, free
                for s in small:
                    if got >= need_gpus:
                        break
                    cost += lost_gpu_s(s, self.now)
                    got += len(s.placement.devices[0])
                if got >= need_gpus:
                    options.append((cost, node_id, small))
        options.sort(key=lambda o: (o[0], o[1]))
        for _cost, node_id, small in options[:SCAN]:
            mark = t.mark()
            node = self.ctx.index.node(node_id)
            assert node is not None
            ok = fitting_keys(r.job, node, self.ctx)
            assert ok is not None
            t.targets.append(node_id)
            freed: set[str] = set()
            moved: list[Job] = []
            for first in [*small, None]:  # None: a last look once every small one moved
                keys = devices_if_freed(r.job, node, freed, {}, ok)
                if keys is not None and host_room(r.job, node, moved):
                    return Placement((node_id,), (keys,))
                if first is not None and self.move_off(t, first, node_id, chain=False):
                    t.release(self.ctx, first)
                    freed.update(first.placement.devices[0])
                    moved.append(first.job)
            t.targets.pop()
            t.undo_to(self.ctx, mark)
        return None

    def best(self) -> tuple[Node, _Try] | None:
        """The plan on the first node, by the lower bound on what freeing it loses, that a plan
        can free (of the :data:`SCAN` lowest), applied.

        Planning them all and keeping the plan that loses least in full (moved jobs' restarts
        counted) was measured worse (``bench.sched --teams 4``, seeds 1-4: average JCT 3% higher
        and one guarantee wait of 62 s): the fewest GPU-seconds lost now is not the shortest
        wait for what the plan leaves behind."""
        options: list[tuple[float, str, list[Running]]] = []
        for node_id in self.running.by_node:
            entry = self.ctx.index.entries.get(node_id)
            if entry is None or node_id in self.exclude:
                continue
            found = self.lower_bound(entry.node)
            if found is not None:
                options.append((found[0], node_id, found[1]))
        options.sort(key=lambda o: (o[0], o[1]))
        for _bound, node_id, clearable in options[:SCAN]:
            node = self.ctx.index.entries[node_id].node
            t = self.plan_on(node, clearable)
            if t is not None:
                return node, t
        return None


def guarantee_for(
    job: Job,
    ctx: Context,
    running: RunningIndex,
    busy: set[str],
    ledger: Ledger,
    exclude: frozenset[str] = frozenset(),
) -> Guarantee | None:
    """The plan that loses least for ``job`` (see the module doc), applied to the index (its
    victims and moved jobs are off the node, ``job`` holds its devices), or ``None``."""
    cfg = ctx.config
    if not wants_guarantee(job) or not cfg.moves or not cfg.preemption:
        return None
    found = _Planner(job, ctx, running, busy, ledger, exclude).best()
    if found is None:
        return None
    node, t = found
    return _commit(job, node, t, ctx, busy)


def _commit(job: Job, node: Node, t: _Try, ctx: Context, busy: set[str]) -> Guarantee:
    """Apply the rest of ``t`` (victims and moved jobs off the node, the job on it)."""
    ok = fitting_keys(job, node, ctx)
    assert ok is not None
    keys = devices_if_freed(job, node, t.freed, {}, ok)
    assert keys is not None
    on_node: list[str] = []
    for v in t.victims:
        if v.placement.node_id == node.node_id:
            apply.release(ctx.index, v.job, v.placement)
            on_node.append(v.job.job_id)
        busy.add(v.job.job_id)
    moves: list[Move] = []
    for r, dest in t.moves:
        apply.release(ctx.index, r.job, r.placement)  # its node's devices only: it holds dest
        busy.add(r.job.job_id)
        if r.placement.node_id == node.node_id:
            on_node.append(r.job.job_id)
        model = model_at(dest, ctx)
        moves.append(Move(r.job.job_id, dest, 0.0, model))
    placement = Placement((node.node_id,), (keys,))
    apply.take(ctx.index, job, placement)
    return Guarantee(
        job.job_id,
        placement,
        tuple(v.job.job_id for v in t.victims),
        tuple(moves),
        tuple(sorted(on_node)),
        t.lost,
    )
