"""Forecasts: when each pending job should start and each job should end, as p50 and p90.

A running job's remaining time comes from the progress it reports: the ETA its runner fits to the
job's own progress history (a robust slope, p50 and p90: :mod:`agent.job.progressfit`),
else the remaining fraction over its recent rate, or, before it reports, from its class's work
distribution less what it has run. The pending jobs are then laid out in queue order on a
timeline of device release times (list scheduling): each takes the node where it would end
soonest, at its speed there. The p50 forecast uses p50 durations throughout, the p90 forecast p90
durations, so a p90 start already allows for the jobs ahead running long.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.policy.context import Context
from agent.policy.filters import node_reason
from agent.policy.index import SlotState
from agent.policy.place import kind_reason
from agent.policy.snapshot import Job, Running

RATE_SD = 0.15
"""Relative spread of a reported rate: how much a job's pace wanders."""


@dataclass(frozen=True, slots=True)
class Forecast:
    """Predicted start and end of one job, p50 and p90 (epoch seconds)."""

    job_id: str
    start_p50: float
    start_p90: float
    end_p50: float
    end_p90: float
    node_id: str | None = None
    """Where the p50 forecast puts it (a gang: its first member)."""
    node_ids: tuple[str, ...] = ()
    """Every node the p50 forecast puts it on (a gang: each member's)."""


def speed_of(r: Running, ctx: Context) -> float:
    job = r.job
    model = r.device_model or "v100"
    if job.is_gang:
        return ctx.model.relative(job.job_class, job.kind, model, job.gpus, consolidated=False)
    return ctx.model.relative(job.job_class, job.kind, model, max(job.gpus_per_node, 1))


def remaining_s(r: Running, ctx: Context) -> tuple[float, float]:
    """p50 and p90 of the time ``r`` still needs from ``now``."""
    now = ctx.snapshot.now
    if r.progress is not None and r.progress >= 1.0:
        return 0.0, 0.0
    at = r.progress_at if r.progress_at is not None else now
    if r.eta_s is not None:
        rem = max(r.eta_s - max(0.0, now - at), 0.0)
        spread = rem * (1.0 + 1.2816 * RATE_SD)
        if r.eta_p90_s is not None:
            return rem, max(r.eta_p90_s - max(0.0, now - at), rem)
        return rem, spread
    if r.progress is not None and r.rate_per_s and r.rate_per_s > 0:
        rem = (1.0 - r.progress) / r.rate_per_s - max(0.0, now - at)
        rem = max(rem, 0.0)
        return rem, rem * (1.0 + 1.2816 * RATE_SD) + 0.0
    elapsed = max(0.0, now - r.started_at)
    if r.progress is not None and r.progress > 0.0 and elapsed > 0:
        total = elapsed / r.progress
        rem = max(total - elapsed, 0.0)
        return rem, rem * 1.5
    d50, d90 = ctx.duration_s(r.job, speed_of(r, ctx))
    rem50 = max(d50 - elapsed, 0.3 * elapsed, 60.0)
    rem90 = max(d90 - elapsed, 1.5 * elapsed, rem50)
    if r.job.max_runtime_s is not None:
        cap = max(r.job.max_runtime_s - elapsed, 0.0)
        return min(rem50, cap), min(rem90, cap)
    return rem50, rem90


class _Timeline:
    """When each device of each node is next free, under one set of durations (built lazily,
    node by node, as jobs are laid out)."""

    def __init__(self, ctx: Context, ends: dict[str, float]) -> None:
        self.ctx = ctx
        self.ends = ends
        self._times: dict[str, list[float]] = {}
        self._room: dict[str, list[int]] = {}
        self.version: dict[str, int] = {}
        self.heaps: dict[tuple[object, ...], list[tuple[float, float, str, int]]] = {}
        self._usable_cache: dict[tuple[int, int], list[int]] = {}
        self._durations: dict[tuple[object, ...], float] = {}

    def _node(self, node_id: str) -> tuple[list[float], list[int], tuple[SlotState, ...]] | None:
        index = self.ctx.index
        entry = index.entries[node_id]
        if entry.group is None:
            return None
        slots = entry.group.slots
        times = self._times.get(node_id)
        if times is None:
            now = self.ctx.snapshot.now
            ends = self.ends
            times = []
            room = []
            for d in entry.ordered:
                if d.whole_job is not None:
                    times.append(ends.get(d.whole_job, now))
                elif d.shares:
                    times.append(max(ends.get(s.job_id, now) for s in d.shares))
                else:
                    times.append(now)
                room.append(d.share_free_bytes)
            self._times[node_id] = times
            self._room[node_id] = room
            self.version[node_id] = 0
        return times, self._room[node_id], slots

    def _usable(self, job: Job, slots: tuple[SlotState, ...]) -> list[int]:
        key = self.ctx.key(job)
        memo = (key, id(slots))
        held = self._usable_cache.get(memo)
        if held is None:
            held = self._usable_cache[memo] = [
                i
                for i, slot in enumerate(slots)
                if kind_reason(job, key, slot.kind, self.ctx) is None
            ]
        return held

    def option(self, job: Job, node_id: str, d_fn: _Duration) -> tuple[float, float] | None:
        """(start, end) of ``job`` on ``node_id`` on this timeline, or ``None``."""
        now = self.ctx.snapshot.now
        if job.gpus_per_node == 0:
            return now, now + self._duration(job, "cpu", d_fn)
        data = self._node(node_id)
        if data is None:
            return None
        times, room, slots = data
        usable = self._usable(job, slots)
        want = 1 if job.is_share else job.gpus_per_node
        if len(usable) < want:
            return None
        by_model: dict[str, list[float]] = {}
        for i in usable:
            kind = slots[i].kind
            if job.is_share:
                fraction = job.share_fraction or 0.0
                need = job.share_mem_bytes or int(fraction * kind.mem_total_bytes)
                start = now if room[i] >= need else times[i]
            else:
                start = times[i]
            by_model.setdefault(kind.model, []).append(start)
        best: tuple[float, float] | None = None
        for model, starts in by_model.items():
            if len(starts) < want:
                continue
            starts.sort()
            start = max(now, starts[want - 1])
            end = start + self._duration(job, model, d_fn)
            if best is None or end < best[1]:
                best = (start, end)
        return best

    def _duration(self, job: Job, model: str, d_fn: _Duration) -> float:
        memo = (self.ctx.key(job), job.job_class, job.max_runtime_s, model, d_fn.q)
        held = self._durations.get(memo)
        if held is None:
            held = self._durations[memo] = d_fn(job, model)
        return held

    def take(self, job: Job, node_id: str, start: float, end: float) -> None:
        """Hold the devices ``job`` would use on ``node_id`` from ``start`` to ``end``."""
        data = self._node(node_id)
        if data is None:
            return
        times, room, slots = data
        want = 1 if job.is_share else job.gpus_per_node
        usable = sorted((times[i], i) for i in self._usable(job, slots) if times[i] <= start + 1e-6)
        if job.is_share:
            for _, i in usable[:1]:
                mem = slots[i].kind.mem_total_bytes
                need = job.share_mem_bytes or int((job.share_fraction or 0.0) * mem)
                room[i] -= need
                if room[i] < need:
                    times[i] = max(times[i], end)
        else:
            for _, i in usable[:want]:
                times[i] = end
        self.version[node_id] = self.version.get(node_id, 0) + 1

    def place(
        self, job: Job, d_fn: _Duration, nodes: Iterable[str] | None = None
    ) -> tuple[float, float, tuple[str, ...]] | None:
        """Earliest-ending place for ``job`` on this timeline (among ``nodes``, default all);
        holds it. ``None``: nowhere."""
        key = (self.ctx.key(job), job.max_runtime_s, job.nodes)
        heap = self.heaps.get(key)
        if heap is None:
            heap = []
            entries = self.ctx.index.entries
            for node_id in entries if nodes is None else nodes:
                entry = entries[node_id]
                if entry.group is None or node_reason(job, entry.node) is not None:
                    continue
                opt = self.option(job, node_id, d_fn)
                if opt is not None:
                    heap.append((opt[1], opt[0], node_id, self.version.get(node_id, 0)))
            heapq.heapify(heap)
            self.heaps[key] = heap
        picked: list[tuple[float, float, str]] = []
        while heap and len(picked) < job.nodes:
            end, start, node_id, version = heapq.heappop(heap)
            if version != self.version.get(node_id, 0):
                opt = self.option(job, node_id, d_fn)
                if opt is not None:
                    heapq.heappush(heap, (opt[1], opt[0], node_id, self.version.get(node_id, 0)))
                continue
            picked.append((end, start, node_id))
        if len(picked) < job.nodes:
            for end, start, node_id in picked:
                heapq.heappush(heap, (end, start, node_id, self.version.get(node_id, 0)))
            return None
        start = max(p[1] for p in picked)
        end = start + max(p[0] - p[1] for p in picked)
        for _end, _start, node_id in picked:
            self.take(job, node_id, start, end)
            opt = self.option(job, node_id, d_fn)
            if opt is not None:
                heapq.heappush(heap, (opt[1], opt[0], node_id, self.version.get(node_id, 0)))
        return start, end, tuple(p[2] for p in picked)


class _Duration:
    def __init__(self, ctx: Context, quantile: int) -> None:
        self.ctx = ctx
        self.q = quantile

    def __call__(self, job: Job, model: str) -> float:
        gpus = max(job.gpus, 1)
        speed = self.ctx.model.relative(
            job.job_class, job.kind, model, gpus, consolidated=not job.is_gang
        )
        return self.ctx.duration_s(job, speed)[self.q]


def forecast(
    ctx: Context,
    order: Sequence[Job],
    started: Iterable[tuple[Job, str, float]] = (),
) -> dict[str, Forecast]:
    """Forecasts for every running job and every job of ``order`` (pending, in queue order).
    ``started``: jobs this pass starts, with the model they start on and when."""
    now = ctx.snapshot.now
    ends50: dict[str, float] = {}
    ends90: dict[str, float] = {}
    out: dict[str, Forecast] = {}
    for r in ctx.snapshot.running:
        rem50, rem90 = remaining_s(r, ctx)
        ends50[r.job.job_id] = now + rem50
        ends90[r.job.job_id] = now + rem90
        out[r.job.job_id] = Forecast(
            r.job.job_id, r.started_at, r.started_at, now + rem50, now + rem90, r.placement.node_id
        )
    starts: dict[str, tuple[str, float]] = {}
    for job, model, at in started:
        starts[job.job_id] = (model, at)
    timelines = (_Timeline(ctx, ends50), _Timeline(ctx, ends90))
    durations = (_Duration(ctx, 0), _Duration(ctx, 1))
    for job in order:
        if job.job_id in starts:
            model, at = starts[job.job_id]
            e50, e90 = at + durations[0](job, model), at + durations[1](job, model)
            out[job.job_id] = Forecast(job.job_id, at, at, e50, e90)
            continue
        placed50 = timelines[0].place(job, durations[0])
        placed90 = timelines[1].place(job, durations[1])
        if placed50 is None or placed90 is None:
            out[job.job_id] = Forecast(job.job_id, math.inf, math.inf, math.inf, math.inf)
            continue
        out[job.job_id] = Forecast(
            job.job_id,
            placed50[0],
            max(placed90[0], placed50[0]),
            placed50[1],
            max(placed90[1], placed50[1]),
            placed50[2][0],
            placed50[2],
        )
    return out
