"""Forecasts: when each pending job should start and each job should end, as p50 and p90.

A running job's remaining time comes from the progress it reports (the remaining fraction over its
recent rate) or, before it reports, from its class's work distribution less what it has run. The
pending jobs are then laid out in queue order on a timeline of device release times (list
scheduling): each takes the node where it would end soonest, at its speed there. The p50 forecast
uses p50 durations throughout, the p90 forecast p90 durations, so a p90 start already allows for
the jobs ahead running long.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.policy.context import Context, req_key
from agent.policy.filters import device_reason, static_fit
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
    """Where the p50 forecast puts it."""


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
    """When each device of each node is next free, under one set of durations."""

    def __init__(self, ctx: Context, ends: dict[str, float]) -> None:
        self.ctx = ctx
        now = ctx.snapshot.now
        self.free_at: dict[str, dict[str, float]] = {}
        self.share_room: dict[str, dict[str, int]] = {}
        self.version: dict[str, int] = {}
        for node_id, entry in ctx.index.entries.items():
            times: dict[str, float] = {}
            room: dict[str, int] = {}
            for d in entry.node.devices:
                if d.whole_job is not None:
                    times[d.key] = ends.get(d.whole_job, now)
                elif d.shares:
                    times[d.key] = max(ends.get(s.job_id, now) for s in d.shares)
                else:
                    times[d.key] = now
                room[d.key] = d.share_free_bytes
            self.free_at[node_id] = times
            self.share_room[node_id] = room
            self.version[node_id] = 0
        self.heaps: dict[tuple[object, ...], list[tuple[float, float, str, int]]] = {}

    def option(self, job: Job, node_id: str, d_fn: _Duration) -> tuple[float, float] | None:
        """(start, end) of ``job`` on ``node_id`` on this timeline, or ``None``."""
        entry = self.ctx.index.entries[node_id]
        now = self.ctx.snapshot.now
        times = self.free_at[node_id]
        best: tuple[float, float] | None = None
        if job.gpus_per_node == 0:
            return now, now + d_fn(job, "cpu")
        by_model: dict[str, list[float]] = {}
        for d in entry.node.devices:
            if device_reason(job, d) is not None:
                continue
            if job.is_share:
                start = (
                    now
                    if self.share_room[node_id][d.key] >= job.share_bytes_on(d)
                    else times[d.key]
                )
                by_model.setdefault(d.model, []).append(start)
            else:
                by_model.setdefault(d.model, []).append(times[d.key])
        want = 1 if job.is_share else job.gpus_per_node
        for model, starts in by_model.items():
            if len(starts) < want:
                continue
            starts.sort()
            start = max(now, starts[want - 1])
            end = start + d_fn(job, model)
            if best is None or end < best[1]:
                best = (start, end)
        return best

    def take(self, job: Job, node_id: str, start: float, end: float) -> None:
        """Hold the devices ``job`` would use on ``node_id`` from ``start`` to ``end``."""
        entry = self.ctx.index.entries[node_id]
        times = self.free_at[node_id]
        want = 1 if job.is_share else job.gpus_per_node
        usable = sorted(
            (times[d.key], d.key, d)
            for d in entry.node.devices
            if device_reason(job, d) is None and times[d.key] <= start + 1e-6
        )
        if job.is_share:
            for _, key, d in usable[:1]:
                self.share_room[node_id][key] -= job.share_bytes_on(d)
                if self.share_room[node_id][key] < job.share_bytes_on(d):
                    times[key] = max(times[key], end)
        else:
            for _, key, _d in usable[:want]:
                times[key] = end
        self.version[node_id] += 1

    def place(self, job: Job, d_fn: _Duration) -> tuple[float, float, tuple[str, ...]] | None:
        """Earliest-ending place for ``job`` on this timeline; holds it. ``None``: nowhere."""
        key = (*req_key(job), job.max_runtime_s, job.nodes)
        heap = self.heaps.get(key)
        if heap is None:
            heap = []
            for node_id, entry in self.ctx.index.entries.items():
                if static_fit(job, entry.node) is not None:
                    continue
                opt = self.option(job, node_id, d_fn)
                if opt is not None:
                    heap.append((opt[1], opt[0], node_id, self.version[node_id]))
            heapq.heapify(heap)
            self.heaps[key] = heap
        picked: list[tuple[float, float, str]] = []
        while heap and len(picked) < job.nodes:
            end, start, node_id, version = heapq.heappop(heap)
            if version != self.version[node_id]:
                opt = self.option(job, node_id, d_fn)
                if opt is not None:
                    heapq.heappush(heap, (opt[1], opt[0], node_id, self.version[node_id]))
                continue
            picked.append((end, start, node_id))
        if len(picked) < job.nodes:
            for end, start, node_id in picked:
                heapq.heappush(heap, (end, start, node_id, self.version[node_id]))
            return None
        start = max(p[1] for p in picked)
        end = start + max(p[0] - p[1] for p in picked)
        for _end, _start, node_id in picked:
            self.take(job, node_id, start, end)
            opt = self.option(job, node_id, d_fn)
            if opt is not None:
                heapq.heappush(heap, (opt[1], opt[0], node_id, self.version[node_id]))
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
        )
    return out
