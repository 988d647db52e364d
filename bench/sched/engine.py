"""The simulated mesh: nodes, owners, a lagging gossip view, and jobs that run at their true speed.

What the live mesh does, in simulated time:

- every job has an owner (rendezvous hashing over ``owners`` agent ids); owners decide from a view
  of the nodes that lags by ``gossip_delay_s`` (a node's change is seen that much later);
- an owner offers a job to the node its policy chose; the node admits it against its real state
  or declines (someone else took the devices meanwhile), and the owner tries the next candidate;
- a running job reports its progress (fraction done and rate) ``report_s`` after it starts, so
  from then on its owner can tell when it ends; before that, only its class's history says;
- jobs checkpoint every ``checkpoint_s``; a job stopped to preempt or move it loses the work
  since its last checkpoint and stops within ``grace_s``; when it runs again (moved, or
  restarted after a preemption) it makes no progress for ``move_cost_s`` (restoring its
  checkpoint);
- jobs that share a GPU slow each other down by Gavel's space-sharing figures.

Policies plug in through :class:`MeshPolicy`: given a snapshot, say what starts where (in order of
preference), what is preempted, what moves. ``fill`` mode is FGD's experiment: jobs never end,
and a job that cannot be placed when it arrives is dropped.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import cast

from agent.policy.fragmentation import Shape
from agent.policy.model import ThroughputModel
from agent.policy.snapshot import Job, Node, Placement, Running, Snapshot
from bench.sched.cluster import NodeSpec
from bench.sched.simtypes import (
    MeshPolicy,
    MoveOrder,
    SimConfig,
    SimDevice,
    SimJob,
    SimNode,
    Start,
    owner_of,
    policy_job,
    true_rate,
)
from bench.sched.teamstats import TeamBook
from bench.sched.traces import TraceJob, shape_of, top_shapes
from bench.sched.truth import Truth


class Simulation:
    """One run of one mesh policy over one trace (see the module doc)."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        jobs: Sequence[TraceJob],
        policy: MeshPolicy,
        truth: Truth,
        config: SimConfig,
        *,
        measure: tuple[int, int] | None = None,
    ) -> None:
        self.config = config
        self.truth = truth
        self.policy = policy
        self.model = ThroughputModel()
        self.now = 0.0
        self.nodes: dict[str, SimNode] = {}
        for spec in nodes:
            devices = {
                f"{spec.node_id}/{i}": SimDevice(f"{spec.node_id}/{i}", spec.model, spec.mem_bytes)
                for i in range(spec.gpus)
            }
            self.nodes[spec.node_id] = SimNode(spec, devices)
        self.total_gpus = sum(s.gpus for s in nodes)
        self.view: dict[str, Node] = {n: s.to_policy() for n, s in self.nodes.items()}
        self._view_tuple: tuple[Node, ...] | None = None
        self._view_version: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self._dirty: set[str] = set()
        owner_ids = [f"owner-{i:04d}" for i in range(max(1, config.owners))]
        self.jobs: dict[str, SimJob] = {}
        for tj in jobs:
            job_id = f"j{tj.index:06d}"
            owner = owner_of(job_id, owner_ids)
            self.jobs[job_id] = SimJob(tj, policy_job(job_id, tj, owner), owner)
        self.pending: dict[str, Job] = {}
        self._pending_tuple: tuple[Job, ...] | None = None
        self._stopping_tuple: tuple[Job, ...] = ()
        self._release_at: dict[str, float] = {}
        """When each job stopping will have stopped."""
        self.running: dict[str, Running] = {}
        self._running_tuple: tuple[Running, ...] | None = None
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = 0
        self._ticks: set[float] = set()
        self._review_pending = False
        for job_id, sj in self.jobs.items():
            self._push(sj.trace.arrival_s, "arrive", job_id)
        lo, hi = measure if measure is not None else (0, len(jobs))
        self.measured = {f"j{i:06d}" for i in range(lo, hi)}
        self.left_to_measure = len(self.measured)
        self.shape_counts: dict[Shape, float] = {}
        self._shapes: tuple[Shape, ...] = ()
        # metrics
        self.alloc_gpus = 0.0
        self._area_at = 0.0
        self.busy_area = 0.0
        self.idle_waiting_area = 0.0
        self.waiting_time = 0.0
        self.decision_ms: list[float] = []
        """Wall-clock milliseconds of each pass that decided something."""
        self.decision_cpu_ms: list[float] = []
        """The same passes in this process's CPU time (what a busy machine does not inflate)."""
        self.tick_ms: list[float] = []
        self.declines = 0
        self.preemptions = 0
        self.moves = 0
        self.dropped = 0
        self.arrived_gpus = 0.0
        self.fill_points: list[tuple[float, float]] = []
        self.last_finish = 0.0
        self.book = TeamBook(config.quotas) if config.quotas else None

    # -- events ----------------------------------------------------------------------------------

    def _push(self, t: float, kind: str, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, payload))

    def _tick_at(self, t: float) -> None:
        if t not in self._ticks:
            self._ticks.add(t)
            self._push(t, "tick", None)

    def run(self, *, wall_limit_s: float | None = None) -> None:
        started = time.perf_counter()
        handlers = {
            "arrive": self._arrive,
            "finish": self._finish,
            "visible": self._visible,
            "report": self._report,
            "start": self._delayed_start,
            "release": self._delayed_release,
            "review": self._review,
            "checkpoint": self._checkpoint,
            "moved": self._moved,
        }
        while self._events:
            t, _seq, kind, payload = heapq.heappop(self._events)
            self._advance(t)
            if kind == "tick":
                self._ticks.discard(t)
                if self._events and self._events[0][0] == t:
                    self._tick_at(t)  # after everything else that happens at this time
                    continue
                self._tick()
            else:
                handlers[kind](payload)
            self._flush()
            if wall_limit_s is not None and time.perf_counter() - started > wall_limit_s:
                break

    def _advance(self, t: float) -> None:
        if self.book is not None:
            self.book.advance(t, self.running.values(), self.pending.values())
        dt = t - self._area_at
        if dt > 0:
            self.busy_area += self.alloc_gpus * dt
            if self.pending:
                self.idle_waiting_area += (self.total_gpus - self.alloc_gpus) * dt
                self.waiting_time += dt
            self._area_at = t
        self.now = t

    def _flush(self) -> None:
        """Publish the nodes that changed: their record reaches the view after the delay."""
        for node_id in self._dirty:
            self._view_version[node_id] += 1
            node = self.nodes[node_id].to_policy()
            version = self._view_version[node_id]
            if self.config.gossip_delay_s <= 0:
                self.view[node_id] = node
                self._view_tuple = None
            else:
                self._push(
                    self.now + self.config.gossip_delay_s, "visible", (node_id, node, version)
                )
        self._dirty.clear()

    def _visible(self, payload: object) -> None:
        node_id, node, version = cast(tuple[str, Node, int], payload)
        if version == self._view_version[node_id]:
            self.view[node_id] = node
            self._view_tuple = None
            self._tick_at(self.now)

    # -- jobs ------------------------------------------------------------------------------------

    def _arrive(self, payload: object) -> None:
        sj = self.jobs[str(payload)]
        tj = sj.trace
        shape = shape_of(tj)
        self.shape_counts[shape] = self.shape_counts.get(shape, 0.0) + 1.0
        self._shapes = ()
        self.arrived_gpus += tj.fraction if tj.fraction is not None else tj.gpus * tj.nodes
        self._set_pending(sj)
        self._tick_at(self.now)

    def _set_pending(self, sj: SimJob) -> None:
        sj.state = "pending"
        self.pending[sj.job.job_id] = sj.job
        self._pending_tuple = None

    def shapes(self) -> tuple[Shape, ...]:
        """The workload's shapes the policy is told: the configured ones (``SimConfig.shapes``),
        else the most common of the jobs arrived so far."""
        if self.config.shapes:
            return self.config.shapes
        if not self._shapes:
            self._shapes = top_shapes(self.shape_counts)
        return self._shapes

    def snapshot(self) -> Snapshot:
        if self._view_tuple is None:
            self._view_tuple = tuple(self.view.values())
        if self._pending_tuple is None:
            self._pending_tuple = tuple(
                j for j in self.pending.values() if not self.jobs[j.job_id].in_flight
            )
            stopping = (self.jobs[j.job_id] for j in self.pending.values())
            self._stopping_tuple = tuple(sj.job for sj in stopping if sj.in_flight and not sj.held)
        if self._running_tuple is None:
            self._running_tuple = tuple(self.running.values())
        return Snapshot(
            now=self.now,
            nodes=self._view_tuple,
            pending=self._pending_tuple,
            running=self._running_tuple,
            shapes=self.shapes(),
            teams=None if self.book is None else self.book.teams_now(self.now),
            stopping=self._stopping_tuple,
        )

    def _review(self, payload: object) -> None:
        self._review_pending = False
        if self.running:
            self._tick(review=True)

    def _tick(self, *, review: bool = False) -> None:
        if self.running and not self._review_pending and not self.config.fill:
            self._review_pending = True
            self._push(self.now + self.config.review_s, "review", None)
        if not self.pending and not self.config.fill and not review:
            return
        snap = self.snapshot()
        t0, c0 = time.perf_counter(), time.process_time()
        plan = self.policy.plan(snap, self)
        elapsed_ms = (time.perf_counter() - t0) * 1000.0
        cpu_ms = (time.process_time() - c0) * 1000.0
        self.tick_ms.append(elapsed_ms)
        if plan.starts or plan.moves:
            self.decision_ms.append(elapsed_ms)
            self.decision_cpu_ms.append(cpu_ms)
        for victim in plan.stops:
            self._stop(victim, preempted=True)
        for move in plan.moves:
            self._move(move)
        declined: set[str] = set()
        for start in plan.starts:
            sj = self.jobs[start.job_id]
            restart = start.job_id in start.after and not sj.held  # it stops first, then starts
            if sj.state != "pending" or (sj.in_flight and not restart):
                continue
            if start.after:
                self._hold_for(sj, start)
                continue
            if not self._offer(sj, start.placements):
                declined.add(start.job_id)
        if self.config.fill:
            for job_id in list(self.pending):
                sj = self.jobs[job_id]
                if not sj.in_flight and sj.state == "pending" and job_id not in declined:
                    self.dropped += 1
                    sj.state = "failed"
                    del self.pending[job_id]
                    self._pending_tuple = None
            self.fill_points.append((self.arrived_gpus, self.alloc_gpus))
        if declined:
            self._tick_at(self.now + self.config.retry_s)

    def _admits(self, sj: SimJob, placement: Placement) -> bool:
        job = sj.job
        for node_id, keys in zip(placement.node_ids, placement.devices, strict=True):
            node = self.nodes.get(node_id)
            if node is None:
                return False
            s = node.spec
            if s.cpu_milli is not None and node.cpu_used + job.cpu_milli > s.cpu_milli:
                return False
            if (
                s.host_mem_bytes is not None
                and node.mem_used + job.host_mem_bytes > s.host_mem_bytes
            ):
                return False
            for key in keys:
                d = node.devices.get(key)
                if d is None:
                    return False
                if placement.share_mem_bytes:
                    if d.share_free() < placement.share_mem_bytes:
                        return False
                elif d.whole is not None or d.shares:
                    return False
        return True

    def _offer(self, sj: SimJob, placements: Sequence[Placement]) -> bool:
        """Offer in turn until a node admits; False if every one declined (or, with
        ``SimConfig.quota_desk``, the team's desk refused it)."""
        book = self.book if self.config.quota_desk else None
        if book is not None and book.would_pass_max(sj.job, self.running.values()):
            self.declines += 1
            return False
        for placement in placements:
            if self._admits(sj, placement):
                self._start(sj, placement)
                return True
            self.declines += 1
        return False

    def _hold_for(self, sj: SimJob, start: Start) -> None:
        """A start that waits for jobs to stop: it goes ahead once they have (a grace period
        from when each was stopped; one whose stop is not known, from now)."""
        if self.book is not None:
            self.book.starting(sj.job, +1)
        sj.in_flight = sj.held = True
        self._pending_tuple = None
        grace = self.now + self.config.grace_s
        at = max(self._release_at.get(job_id, grace) for job_id in start.after)
        self._push(at, "start", (sj.job.job_id, start.placements))

    def _delayed_start(self, payload: object) -> None:
        job_id, placements = cast(tuple[str, tuple[Placement, ...]], payload)
        sj = self.jobs[job_id]
        if self.book is not None:
            self.book.starting(sj.job, -1)
        sj.in_flight = sj.held = False
        self._pending_tuple = None
        if sj.state != "pending" or not self._offer(sj, placements):
            self._tick_at(self.now)

    def _take(self, sj: SimJob, placement: Placement) -> None:
        job = sj.job
        for node_id, keys in zip(placement.node_ids, placement.devices, strict=True):
            node = self.nodes[node_id]
            node.cpu_used += job.cpu_milli
            node.mem_used += job.host_mem_bytes
            for key in keys:
                d = node.devices[key]
                if placement.share_mem_bytes:
                    d.shares[job.job_id] = (placement.share_mem_bytes, job.job_class)
                    self.alloc_gpus += placement.share_mem_bytes / d.mem_bytes
                else:
                    d.whole = job.job_id
                    self.alloc_gpus += 1.0
            self._dirty.add(node_id)

    def _release(self, sj: SimJob, placement: Placement) -> list[str]:
        """Free what ``sj`` held; the jobs whose GPU it shared (their speed changes)."""
        job = sj.job
        neighbours: list[str] = []
        for node_id, keys in zip(placement.node_ids, placement.devices, strict=True):
            node = self.nodes[node_id]
            node.cpu_used -= job.cpu_milli
            node.mem_used -= job.host_mem_bytes
            for key in keys:
                d = node.devices[key]
                if placement.share_mem_bytes:
                    if d.shares.pop(job.job_id, None) is not None:
                        self.alloc_gpus -= placement.share_mem_bytes / d.mem_bytes
                    neighbours.extend(d.shares)
                elif d.whole == job.job_id:
                    d.whole = None
                    self.alloc_gpus -= 1.0
            self._dirty.add(node_id)
        return neighbours

    def _rate(self, sj: SimJob, placement: Placement) -> tuple[float, str]:
        return true_rate(self.truth, sj, self.nodes[placement.node_ids[0]], placement)

    def _start(self, sj: SimJob, placement: Placement, *, resume_at: float | None = None) -> None:
        now = self.now
        if resume_at is None:
            sj.moved_at = None  # a new attempt: its start is what the guard counts from
        if resume_at is None and sj.first_start is not None:
            resume_at = now + self.config.move_cost_s  # restarted after a preemption
        self._take(sj, placement)
        sj.state = "running"
        sj.placement = placement
        self.pending.pop(sj.job.job_id, None)
        self._pending_tuple = None
        if sj.first_start is None:
            sj.first_start = now
        sj.attempt_start = now
        sj.seg_start = now if resume_at is None else resume_at
        sj.rate, sj.model = self._rate(sj, placement)
        sj.reported = False
        self._schedule_finish(sj)
        self._set_running(sj)
        if not math.isinf(sj.trace.work):
            self._push(sj.seg_start + self.config.report_s, "report", (sj.job.job_id, sj.version))
            self._push_checkpoint(sj, 1)
        if placement.share_mem_bytes:
            self._reshare(placement, skip=sj.job.job_id)

    def _reshare(self, placement: Placement, skip: str | None = None) -> None:
        node = self.nodes[placement.node_ids[0]]
        for key in placement.devices[0]:
            for other in list(node.devices[key].shares):
                if other != skip:
                    self._rerate(self.jobs[other])

    def _rerate(self, sj: SimJob) -> None:
        if sj.state != "running" or sj.placement is None:
            return
        t = max(self.now, sj.seg_start)
        sj.done = sj.steps_at(t)
        sj.ref_s += self._ref_seconds(sj, t)
        sj.seg_start = t
        sj.rate, sj.model = self._rate(sj, sj.placement)
        self._schedule_finish(sj)
        self._set_running(sj)
        if not math.isinf(sj.trace.work):
            self._push_checkpoint(sj, 1)

    def _ref_seconds(self, sj: SimJob, until: float) -> float:
        elapsed = max(0.0, until - sj.seg_start)
        j = sj.job
        return elapsed * self.model.relative(
            j.job_class, j.kind, sj.model, max(j.gpus, 1), consolidated=not j.is_gang
        )

    def _schedule_finish(self, sj: SimJob) -> None:
        sj.version += 1
        if sj.rate <= 0 or math.isinf(sj.trace.work):
            sj.finish_at = None
            return
        sj.finish_at = sj.seg_start + max(0.0, sj.trace.work - sj.done) / sj.rate
        self._push(sj.finish_at, "finish", (sj.job.job_id, sj.version))

    def _set_running(self, sj: SimJob) -> None:
        assert sj.placement is not None
        progress = rate = at = None
        if sj.reported and not math.isinf(sj.trace.work):
            at = sj.seg_start
            progress = sj.done / sj.trace.work
            rate = sj.rate / sj.trace.work
        ckpt_at, _ = sj.checkpoint_at(self.now, self.config.checkpoint_s)
        sj.running = Running(
            job=sj.job,
            placement=sj.placement,
            started_at=sj.attempt_start,
            device_model=sj.model,
            progress=progress,
            progress_at=at,
            rate_per_s=rate,
            last_checkpoint_at=ckpt_at,
            moved_at=sj.moved_at,
        )
        self.running[sj.job.job_id] = sj.running
        self._running_tuple = None

    def _checkpoint(self, payload: object) -> None:
        """A running job saved a checkpoint: its record says so (as a node's record tells the
        live mesh when each job's checkpoint folder last changed), and it saves the next one
        ``checkpoint_s`` later."""
        job_id, version, k = cast(tuple[str, int, int], payload)
        sj = self.jobs[job_id]
        if sj.version != version or sj.state != "running":
            return  # a checkpoint of a run since stopped, moved or slowed
        self._set_running(sj)
        self._push_checkpoint(sj, k + 1)

    def _push_checkpoint(self, sj: SimJob, k: int) -> None:
        """The ``k``-th checkpoint of the job's run (a moment after it, so that
        :meth:`SimJob.checkpoint_at` counts it whatever the rounding)."""
        at = sj.seg_start + k * self.config.checkpoint_s + 1e-3
        self._push(at, "checkpoint", (sj.job.job_id, sj.version, k))

    def _report(self, payload: object) -> None:
        job_id, version = cast(tuple[str, int], payload)
        sj = self.jobs[job_id]
        if sj.version != version or sj.state != "running":
            return
        sj.reported = True
        j = sj.job
        self.model.observe(j.job_class, sj.model, max(j.gpus, 1), sj.rate, self.now)
        self._set_running(sj)

    def _finish(self, payload: object) -> None:
        job_id, version = cast(tuple[str, int], payload)
        sj = self.jobs[job_id]
        if sj.version != version or sj.state != "running" or sj.placement is None:
            return
        sj.ref_s += self._ref_seconds(sj, self.now)
        neighbours = self._release(sj, sj.placement)
        sj.state = "done"
        self.running.pop(job_id, None)
        self._running_tuple = None
        j = sj.job
        self.model.observe_work(j.job_class, sj.ref_s, self.now)
        self.last_finish = max(self.last_finish, self.now)
        if job_id in self.measured:
            self.left_to_measure -= 1
        for other in neighbours:
            self._rerate(self.jobs[other])
        self._tick_at(self.now + self.config.gossip_delay_s)

    def _stop(self, job_id: str, *, preempted: bool) -> None:
        """Stop a running job (checkpoint signal, grace period) and queue it again."""
        sj = self.jobs.get(job_id)
        if sj is None or sj.state != "running" or sj.placement is None:
            return
        ckpt_at, steps = sj.checkpoint_at(self.now, self.config.checkpoint_s)
        sj.ref_s += self._ref_seconds(sj, ckpt_at)
        sj.done = steps
        sj.version += 1
        ran_s = max(0.0, self.now - sj.attempt_start) * max(sj.job.gpus, 1)
        sj.job = replace(sj.job, attained_gpu_s=sj.job.attained_gpu_s + ran_s)
        placement = sj.placement
        sj.placement = None
        self.running.pop(job_id, None)
        self._running_tuple = None
        self.preemptions += int(preempted)
        self._set_pending(sj)
        sj.in_flight = True  # it is stopping: not placed again until it has
        self._release_at[job_id] = self.now + self.config.grace_s
        self._push(self.now + self.config.grace_s, "release", (job_id, placement, True))

    def _delayed_release(self, payload: object) -> None:
        """Devices a job left are free: it has stopped (``ends_stop``; unless a start waits
        for it, it may be placed again), or it left them moving."""
        job_id, placement, ends_stop = cast(tuple[str, Placement, bool], payload)
        sj = self.jobs[job_id]
        if ends_stop:
            self._release_at.pop(job_id, None)
        for other in self._release(sj, placement):
            self._rerate(self.jobs[other])
        if ends_stop and sj.state == "pending" and not sj.held:
            sj.in_flight = False
            self._pending_tuple = None
        self._tick_at(self.now)

    def _move(self, move: MoveOrder) -> None:
        sj = self.jobs.get(move.job_id)
        if sj is None or sj.state != "running" or sj.placement is None:
            return
        if not move.after and not self._admits(sj, move.placement):
            self.declines += 1
            return
        ckpt_at, steps = sj.checkpoint_at(self.now, self.config.checkpoint_s)
        sj.ref_s += self._ref_seconds(sj, ckpt_at)
        old = sj.placement
        sj.done = steps
        self.moves += 1
        sj.moved_at = self.now
        if move.after:  # onto devices still stopping: it stops now, restarts once they are free
            sj.version += 1
            sj.seg_start, sj.rate = self.now, 0.0
            self._set_running(sj)
            payload = (sj.job.job_id, sj.version, move.placement)
            self._push(self.now + self.config.grace_s, "moved", payload)
            return
        self._push(self.now + self.config.grace_s, "release", (sj.job.job_id, old, False))
        self._start(sj, move.placement, resume_at=self.now + self.config.move_cost_s)

    def _moved(self, payload: object) -> None:
        """A move that waited for jobs to stop: it leaves its devices and restarts on the new
        ones (or on its old ones, if the new are taken: it lost its place meanwhile)."""
        job_id, version, placement = cast(tuple[str, int, Placement], payload)
        sj = self.jobs[job_id]
        if sj.version != version or sj.state != "running" or sj.placement is None:
            return  # stopped meanwhile (preempted)
        for other in self._release(sj, sj.placement):
            self._rerate(self.jobs[other])
        if not self._admits(sj, placement):
            self.declines += 1
            placement = sj.placement
        self._start(sj, placement, resume_at=self.now + self.config.move_cost_s)
        self._tick_at(self.now)

    # -- results ---------------------------------------------------------------------------------

    def finished(self) -> list[SimJob]:
        return [sj for sj in self.jobs.values() if sj.state == "done"]
