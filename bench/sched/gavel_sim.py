"""The ``gavel`` baseline: Gavel's heterogeneity-aware max-min fairness with its round-based
mechanism (Narayanan et al., OSDI 2020), written from the paper and the description of its
``max_min_fairness_perf`` policy and scheduler (stanford-futuredata/gavel), not copied.

Central, with a fresh view and oracle throughputs (the generous reading of a baseline):

- when the set of active jobs changes, an LP gives each job ``x[j][t]``, the fraction of time it
  should spend on each GPU type, maximizing the least throughput any job gets relative to its
  throughput under an equal split of every type (scale factors weighed as Gavel does);
- every round (360 s; 720 s under ``same`` costs, below) the jobs furthest behind their
  allocation (``x`` over the share of time received since the last change) run, greedily, as
  long as their GPUs are free; a job whose GPUs fit on one node runs consolidated, else spread
  over nodes at Gavel's lower figure;
- a job that ends within a round leaves its GPUs idle until the round ends.

Two terms (``costs``). ``paper``, as Gavel's own simulator: preemption between rounds costs
nothing and the LP is given the true throughputs. ``same`` (the default), the terms the
simulated mesh gives every other policy (:mod:`bench.sched.engine`): a job that ran in a round
and does not go on in the next on the same nodes (preempted, or moved) loses the work since its
last checkpoint (every ``checkpoint_s`` of its run); a job that starts on GPUs a stopped job
held waits ``grace_s`` for it to stop; a job that resumes (after a preemption or a move) makes
no progress for ``restart_s`` (restoring its checkpoint); and the LP knows the throughputs only
as a :class:`~agent.policy.model.ThroughputModel` learns them from the rates jobs report, as
Shoal's does.

Under ``same`` Gavel is not made a straw man that pays a restart every round: a fair Gavel on
those terms skips a reallocation that would cost more than it gains. A job that ran in the round
just past goes on where it was (its GPUs first, ahead of the LP's order) until its run has
passed a checkpoint and the checkpoint is less than a round old, so a preemption or a move loses
at most one round of work (``keep_until_checkpoint``; off under ``paper``, where stopping is
free), and its rounds are twice as long (:data:`SAME_ROUND_S`). A job spread over several
nodes goes on on the same GPUs of the same nodes when they are free, as a one-node job does.

Needs SciPy (the LP); ``bench.sched`` reports the policy as unavailable without it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.policy.model import ThroughputModel
from bench.sched.cluster import NodeSpec
from bench.sched.traces import TraceJob
from bench.sched.truth import Truth

ROUND_S = 360.0
SAME_ROUND_S = 720.0
"""Gavel's round under ``same`` costs: of 360, 540, 720, 1,080 and 1,800 s, the only one with
which it finished every measured job of the synthetic trace at 4 jobs/h, seed 1 (the docs'
performance page gives the figures)."""
HORIZON = 4.0
"""Under ``same`` costs a run stops at this many times the last arrival (plus 100 rounds):
rounds shorter than the jobs' checkpoint interval can make jobs that alternate lose all their
work, round after round, and never end (their JCTs are then missing: ``jobs_unfinished``)."""
REPORT_S = 60.0
"""A job reports its rate this long after it starts (as in the simulated mesh)."""


@dataclass(frozen=True, slots=True)
class Costs:
    """What a preemption or a move costs a job (``paper``: nothing, and true throughputs)."""

    name: str = "same"
    checkpoint_s: float = 1800.0
    grace_s: float = 30.0
    restart_s: float = 60.0

    @property
    def free(self) -> bool:
        return self.name == "paper"


@dataclass(slots=True)
class _Job:
    trace: TraceJob
    remaining: float
    scale: int
    first_start: float | None = None
    finish: float | None = None
    time_on: dict[str, float] = field(default_factory=dict)
    last_nodes: tuple[str, ...] = ()
    last_split: tuple[int, ...] = ()
    """GPUs it held on each of ``last_nodes``."""
    last_type: str | None = None
    ran_last: bool = False
    """It ran in the round just past."""
    seg_s: float = 0.0
    """Seconds of progress since it last (re)started: its checkpoints fall every
    ``checkpoint_s`` of them."""
    seg_rate: float = 0.0


class GavelSim:
    name = "gavel"

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        jobs: Sequence[TraceJob],
        truth: Truth,
        *,
        measure: tuple[int, int] | None = None,
        round_s: float | None = None,
        costs: Costs | None = None,
        keep_until_checkpoint: bool | None = None,
    ) -> None:
        self.truth = truth
        self.costs = costs or Costs()
        if round_s is None:
            round_s = ROUND_S if self.costs.free else SAME_ROUND_S
        self.round_s = round_s
        self.keep_until_checkpoint = (
            not self.costs.free if keep_until_checkpoint is None else keep_until_checkpoint
        )
        """A job that ran last round goes on until a checkpoint less than a round old (``same``)."""
        self.kept = 0
        """Job-rounds a job went on where it was only because it had not reached a checkpoint."""
        self.model = ThroughputModel()
        """What the LP is told of speeds under ``same`` costs: learned from reported rates."""
        self.preemptions = 0
        self.moves = 0
        self.gave_up_at: float | None = None
        """Under ``same`` costs, when the run stopped with jobs unfinished (:data:`HORIZON`)."""
        self.lost_gpu_s = 0.0
        """GPU-seconds of progress lost to preemptions and moves (checkpoints, restarts)."""
        self.types: dict[str, list[NodeSpec]] = {}
        for spec in nodes:
            self.types.setdefault(spec.model, []).append(spec)
        self.capacity = {t: sum(n.gpus for n in ns) for t, ns in self.types.items()}
        self.total_gpus = sum(self.capacity.values())
        self.jobs = [_Job(tj, tj.work, max(1, tj.gpus * tj.nodes)) for tj in jobs]
        lo, hi = measure if measure is not None else (0, len(jobs))
        self.measured = set(range(lo, hi))
        self.busy_area = 0.0
        self.idle_waiting_area = 0.0
        self.waiting_time = 0.0
        self.decision_ms: list[float] = []
        self.last_finish = 0.0
        self.now = 0.0

    def _rate(self, j: _Job, t: str, consolidated: bool = True) -> float:
        tj = j.trace
        if tj.models and t not in tj.models:
            return 0.0
        return self.truth.rate(tj.job_class, t, j.scale, consolidated)

    def _told(self, j: _Job, t: str) -> float:
        """The throughput the LP is given: the truth (``paper``), else the learned model's."""
        if self.costs.free:
            return self._rate(j, t)
        tj = j.trace
        if tj.models and t not in tj.models:
            return 0.0
        return self.model.speed(tj.job_class, tj.kind, t, j.scale).value

    def _allocation(self, active: Sequence[_Job]) -> dict[int, dict[str, float]]:
        import numpy as np
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix

        types = sorted(self.types)
        n, m = len(active), len(types)
        thr = np.array([[self._told(j, t) for t in types] for j in active])
        scale = np.array([float(j.scale) for j in active])
        share = np.array([self.capacity[t] / n for t in types])
        if share.sum() > 1.0:
            share = share / share.sum()
        proportional = (thr * share).sum(axis=1)
        proportional[proportional <= 0] = 1.0
        weight = thr * (scale / proportional)[:, None]
        nvar = n * m + 1
        rows, cols, vals, bounds_ub = [], [], [], []
        r = 0
        for i in range(n):  # z - sum_t w[i,t] x[i,t] <= 0
            for k in range(m):
                rows.append(r)
                cols.append(i * m + k)
                vals.append(-weight[i, k])
            rows.append(r)
            cols.append(n * m)
            vals.append(1.0)
            bounds_ub.append(0.0)
            r += 1
        for i in range(n):  # sum_t x[i,t] <= 1
            for k in range(m):
                rows.append(r)
                cols.append(i * m + k)
                vals.append(1.0)
            bounds_ub.append(1.0)
            r += 1
        for k, t in enumerate(types):  # sum_i scale_i x[i,t] <= N_t
            for i in range(n):
                rows.append(r)
                cols.append(i * m + k)
                vals.append(scale[i])
            bounds_ub.append(float(self.capacity[t]))
            r += 1
        a = coo_matrix((vals, (rows, cols)), shape=(r, nvar)).tocsr()
        c = np.zeros(nvar)
        c[-1] = -1.0
        bounds: list[tuple[float, float | None]] = [
            (0.0, 1.0 if thr[i // m, i % m] > 0 else 0.0) for i in range(n * m)
        ]
        bounds.append((0.0, None))
        res = linprog(c, A_ub=a, b_ub=np.array(bounds_ub), bounds=bounds, method="highs")
        x = res.x[:-1].reshape(n, m) if res.x is not None else np.zeros((n, m))
        return {
            id(j): {t: float(max(0.0, x[i, k])) for k, t in enumerate(types)}
            for i, j in enumerate(active)
        }

    def _place(
        self, order: list[tuple[_Job, str]]
    ) -> dict[int, tuple[tuple[str, ...], bool, tuple[int, ...]]]:
        """Nodes for each scheduled job (and GPUs on each): its previous ones if free, else one
        node that fits (the fullest), else spread over the freest."""
        free = {n.node_id: n.gpus for ns in self.types.values() for n in ns}
        by_type = {t: [n.node_id for n in ns] for t, ns in self.types.items()}
        out: dict[int, tuple[tuple[str, ...], bool, tuple[int, ...]]] = {}
        pending: list[tuple[_Job, str]] = []
        for j, t in sorted(order, key=lambda e: -e[0].scale):
            split = j.last_split if len(j.last_split) == len(j.last_nodes) else ()
            if (
                j.ran_last
                and j.last_type == t
                and split
                and all(free[n] >= k for n, k in zip(j.last_nodes, split, strict=True))
            ):
                for n, k in zip(j.last_nodes, split, strict=True):
                    free[n] -= k
                out[id(j)] = (j.last_nodes, len(j.last_nodes) == 1, split)
                continue
            pending.append((j, t))
        for j, t in pending:
            fits = [n for n in by_type[t] if free[n] >= j.scale]
            if fits:
                node = min(fits, key=lambda n: (free[n], n))
                free[node] -= j.scale
                out[id(j)] = ((node,), True, (j.scale,))
                continue
            need, used, takes = j.scale, [], []
            for node in sorted(by_type[t], key=lambda n: -free[n]):
                if need <= 0:
                    break
                take = min(free[node], need)
                if take > 0:
                    free[node] -= take
                    need -= take
                    used.append(node)
                    takes.append(take)
            out[id(j)] = (tuple(used), False, tuple(takes))
        return out

    def _must_go_on(self, j: _Job) -> bool:
        """``j`` ran last round and stopping it now would lose more than a round of work: its
        run has not passed a checkpoint, or its last one is more than a round old."""
        if not self.keep_until_checkpoint or not j.ran_last or j.last_type is None:
            return False
        every = self.costs.checkpoint_s
        since_s = j.seg_s - math.floor(j.seg_s / every) * every
        return j.seg_s < every or since_s > self.round_s

    def _stop(self, j: _Job, scheduled: Sequence[tuple[_Job, str]]) -> tuple[str, ...]:
        """``j`` ran last round and does not go on where it was: a preemption, or a move if it
        runs elsewhere this round. It loses the work since its last checkpoint (``same``);
        the nodes it held, which a job starting there waits for."""
        if any(o is j for o, _w in scheduled):
            self.moves += 1
        else:
            self.preemptions += 1
        if self.costs.free:
            return ()
        every = self.costs.checkpoint_s
        since_s = j.seg_s - math.floor(j.seg_s / every) * every
        j.remaining += j.seg_rate * since_s
        self.lost_gpu_s += since_s * j.scale
        j.seg_s = 0.0
        return j.last_nodes

    def run(self, *, wall_limit_s: float | None = None) -> None:
        started = time.perf_counter()
        arrivals = sorted(self.jobs, key=lambda j: j.trace.arrival_s)
        nxt = 0
        active: list[_Job] = []
        alloc: dict[int, dict[str, float]] = {}
        changed = True
        worker_time = dict.fromkeys(self.types, 0.0)
        left = len(self.measured)
        t = 0.0
        last_arrival = arrivals[-1].trace.arrival_s if arrivals else 0.0
        horizon = math.inf if self.costs.free else HORIZON * last_arrival + 100 * self.round_s
        while nxt < len(arrivals) or active:
            if t > horizon:
                self.gave_up_at = t
                break
            while nxt < len(arrivals) and arrivals[nxt].trace.arrival_s <= t:
                active.append(arrivals[nxt])
                nxt += 1
                changed = True
            if not active:
                t = max(t, math.ceil(arrivals[nxt].trace.arrival_s / self.round_s) * self.round_s)
                continue
            t0 = time.perf_counter()
            if changed:
                alloc = self._allocation(active)
                changed = False
                for w in worker_time:
                    worker_time[w] = 0.0
                    for j in active:
                        j.time_on[w] = self.round_s / 2.0
                        worker_time[w] += j.time_on[w]
            entries = []
            for w in sorted(self.types):
                for j in active:
                    if self._rate(j, w) <= 0:
                        continue
                    a = alloc[id(j)][w]
                    frac = j.time_on.get(w, 0.0) / worker_time[w] if worker_time[w] > 0 else 0.0
                    priority = a * 1e9 if frac <= 0 else a / frac
                    entries.append((priority, a, -j.trace.index, w, j))
            entries.sort(key=lambda e: (e[0], e[1], e[2]), reverse=True)
            left_gpus = dict(self.capacity)
            scheduled: list[tuple[_Job, str]] = []
            seen: set[int] = set()
            for j in active:
                if self._must_go_on(j) and j.last_type is not None:
                    w = j.last_type
                    left_gpus[w] -= j.scale
                    seen.add(id(j))
                    scheduled.append((j, w))
                    self.kept += 1
            for _p, _a, _i, w, j in entries:
                if id(j) in seen or j.scale > left_gpus[w]:
                    continue
                left_gpus[w] -= j.scale
                seen.add(id(j))
                scheduled.append((j, w))
            placed = self._place(scheduled)
            self.decision_ms.append((time.perf_counter() - t0) * 1000.0)
            going_on = {
                id(j)
                for j, w in scheduled
                if j.ran_last and placed[id(j)][0] == j.last_nodes and w == j.last_type
            }
            freed: set[str] = set()
            for j in active:
                if j.ran_last and id(j) not in going_on:
                    freed.update(self._stop(j, scheduled))
            busy = 0.0
            for j, w in scheduled:
                nodes, consolidated, split = placed[id(j)]
                rate = self._rate(j, w, consolidated)
                wait_s = 0.0
                if id(j) not in going_on:
                    if not self.costs.free:
                        if freed & set(nodes):
                            wait_s += self.costs.grace_s
                        if j.first_start is not None:
                            wait_s += self.costs.restart_s
                    j.seg_s = 0.0
                if j.first_start is None:
                    j.first_start = t
                left_s = self.round_s - wait_s
                run_s = min(left_s, j.remaining / rate) if rate > 0 else left_s
                j.remaining -= rate * run_s
                j.seg_s += run_s
                j.seg_rate = rate
                if run_s >= REPORT_S and not self.costs.free:
                    tj = j.trace
                    self.model.observe(tj.job_class, w, j.scale, rate, t + wait_s + REPORT_S)
                j.time_on[w] = j.time_on.get(w, 0.0) + run_s
                worker_time[w] += run_s
                j.last_nodes, j.last_type, j.last_split = nodes, w, split
                busy += (wait_s + run_s) * j.scale
                if j.remaining <= 1e-9 * max(1.0, j.trace.work):
                    j.finish = t + wait_s + run_s
                    self.last_finish = max(self.last_finish, j.finish)
                    if j.trace.index in self.measured:
                        left -= 1
            self.busy_area += busy
            waiting = len(scheduled) < len(active)
            if waiting:
                self.idle_waiting_area += self.total_gpus * self.round_s - busy
                self.waiting_time += self.round_s
            ran = {id(j) for j, _w in scheduled}
            for j in active:
                j.ran_last = id(j) in ran and j.finish is None
            done = [j for j in active if j.finish is not None]
            if done:
                active = [j for j in active if j.finish is None]
                changed = True
            t += self.round_s
            self.now = t
            if left <= 0 and nxt >= len(arrivals) and not active:
                break
            if wall_limit_s is not None and time.perf_counter() - started > wall_limit_s:
                break
