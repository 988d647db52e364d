"""The table views: hosts, GPUs, jobs and events, each a :class:`~tui.widgets.tables.MeshTable`.

Each says which rows a snapshot gives (``(stable key, item)`` pairs, the item the model object
itself), what the filter matches in a row, the cells of a row on screen, and what a row selects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

from tui.model import DeviceView, EventView, HostView, JobTimes, JobView, MeshSnapshot
from tui.widgets.base import Selection, ViewContext
from tui.widgets.render import (
    Level,
    Palette,
    Part,
    clip,
    duration,
    load_level,
    mem_pair,
    pct,
    state_level,
    temp,
    temp_level,
    watts,
)
from tui.widgets.tables import Column, MeshTable, Row, SortSpec


def _nz(value: float | None) -> float:
    return -1.0 if value is None else value


def _hottest(host: HostView) -> DeviceView | None:
    """The GPU closest to its own slowdown point."""
    return max(
        (d for d in host.devices if d.temp_c is not None),
        key=lambda d: (d.temp_c or 0.0) - (d.slowdown_c or 85.0),
        default=None,
    )


def _host_mem_frac(host: HostView) -> float | None:
    used, total = host.mem_used_bytes, host.gpu_mem_total_bytes
    return None if used is None or not total else used / total


def _util_cell(value: float | None, p: Palette) -> Part:
    level: Level = "muted" if value is None else load_level(value / 100.0)
    return pct(None if value is None else round(value)), p.of(level)


class HostsTable(MeshTable):
    view_name = "hosts"
    COLUMNS = (
        Column("host", "Host", 14),
        Column("state", "State", 7),
        Column("drain", "Drain", 11),
        Column("platform", "OS/arch", 14),
        Column("gpus", "GPU", 3, right=True),
        Column("util", "Util", 4, right=True),
        Column("mem", "GPU mem", 9),
        Column("temp", "Temp", 5),
        Column("jobs", "Job", 3, right=True),
        Column("age", "Seen", 5),
    )
    SORTS: ClassVar[Mapping[str, SortSpec]] = {
        "name": (lambda h: (h.hostname, h.node_id), False),
        "util": (lambda h: _nz(h.util_pct), True),
        "mem": (lambda h: _nz(_host_mem_frac(h)), True),
        "temp": (lambda h: _nz(None if (d := _hottest(h)) is None else d.temp_c), True),
    }

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        node_id = ctx.scope.node_id
        for h in ctx.snapshot.hosts:
            if node_id is None or h.node_id == node_id:
                yield h.node_id, h

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        h: HostView = item
        first_gpu = h.devices[0].name if h.devices else ""
        return " ".join(
            (h.hostname, h.node_id, h.state, h.drain, h.vendor, h.zone, h.platform, first_gpu)
        )

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        h: HostView = item
        p = ctx.palette
        hot = _hottest(h)
        t_level: Level = "muted" if hot is None else temp_level(hot.temp_c, hot.slowdown_c)
        age_level: Level = "bad" if h.state == "dead" else "warn" if h.stale else "muted"
        mem_level = load_level(_host_mem_frac(h))
        return (
            (h.hostname, None),
            (h.state, p.of(state_level(h.state))),
            (h.drain, p.of(state_level(h.drain))),
            (h.platform, p.muted),
            (str(len(h.devices)), None),
            _util_cell(h.util_pct, p),
            (mem_pair(h.mem_used_bytes, h.gpu_mem_total_bytes), p.of(mem_level)),
            (temp(None if hot is None else hot.temp_c), p.of(t_level)),
            (str(len(h.running_jobs)), None),
            (duration(h.telemetry_age_s) + ("!" if h.stale else ""), p.of(age_level)),
        )

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        host = snapshot.host(key)
        if host is None:
            return None
        return Selection("host", node_id=key, raw=host.raw, title=host.hostname)


GpuRow = tuple[HostView, DeviceView, str | None]
"""A GPU's row item: its host, itself, and the live job holding it."""


class GpusTable(MeshTable):
    view_name = "gpus"
    COLUMNS = (
        Column("host", "Host", 14),
        Column("index", "#", 2, right=True),
        Column("model", "Model", 12),
        Column("util", "Util", 4, right=True),
        Column("mem", "Mem", 8),
        Column("temp", "Temp", 5),
        Column("power", "Power", 9),
        Column("job", "Job", 8),
    )
    SORTS: ClassVar[Mapping[str, SortSpec]] = {
        "name": (lambda r: (r[0].hostname, r[0].node_id, r[1].index), False),
        "util": (lambda r: _nz(r[1].util_pct), True),
        "mem": (lambda r: _nz(r[1].mem_frac), True),
        "temp": (lambda r: _nz(r[1].temp_c), True),
    }

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        snapshot = ctx.snapshot
        holder = snapshot.holders()
        scope = ctx.scope
        for h in snapshot.hosts:
            if scope.node_id is not None and h.node_id != scope.node_id:
                continue
            node_id = h.node_id
            for d in h.devices:
                if scope.device_key is None or d.key == scope.device_key:
                    yield d.row_key, (h, d, holder.get((node_id, d.key)))

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        h, d, holding = item
        return f"{h.hostname} {h.node_id} {d.name} {d.vendor} {d.backend} {holding or ''}"

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        h, d, holding = item
        p = ctx.palette
        stale = h.stale
        t_level: Level = "muted" if stale else temp_level(d.temp_c, d.slowdown_c)
        job: Part = ("stale", p.of("warn")) if stale else ((holding or "idle")[:8], p.muted)
        return (
            (h.hostname, None),
            (str(d.index), None),
            (d.short_name, None),
            _util_cell(d.util_pct, p),
            (mem_pair(d.mem_used_bytes, d.mem_total_bytes), p.of(load_level(d.mem_frac))),
            (temp(d.temp_c), p.of(t_level)),
            (watts(d.power_mw, d.power_limit_mw), None),
            job,
        )

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        node_id, _, device_key = key.partition("/")
        host = snapshot.host(node_id)
        if host is None:
            return None
        device = next((d for d in host.devices if d.key == device_key), None)
        jobs = snapshot.jobs_on(node_id, device_key)
        return Selection(
            "gpu",
            node_id=node_id,
            device_key=device_key,
            job_id=jobs[0].job_id if jobs else None,
            raw=None if device is None else device.raw,
            title=f"{host.hostname} GPU {device.index if device else '?'}",
        )


class JobRow(NamedTuple):
    """A job's row item: the job, and when the policy (or the job itself) says it should start
    and end."""

    job: JobView
    times: JobTimes


def _soon(seconds: float | None) -> str:
    """``~12m`` from now; ``now`` for what is due; ``-`` when not predicted."""
    if seconds is None:
        return "-"
    return "now" if seconds < 1 else f"~{duration(seconds)}"


def job_hosts(job: JobView, snapshot: MeshSnapshot, width: int) -> str:
    """Where a job runs, in a cell ``width`` wide: its host, or a gang's first host and how
    many more (``h100-00 +1``, the host name cut so the count always shows); ``-`` before it is
    placed."""
    placed = job.placed()
    if not placed:
        return "-"
    first = snapshot.hostname(placed[0][0])
    if len(placed) == 1:
        return first
    more = f" +{len(placed) - 1}"
    return clip(first, max(1, width - len(more))) + more


def job_gpus(job: JobView) -> str:
    """GPUs per node, times the nodes of a gang (``2x4``); an elastic job's held and its range
    (``3 (2-4)``)."""
    if job.gpus_max_per_node is not None:
        span = f"({job.gpus_per_node}-{job.gpus_max_per_node})"
        return f"{len(job.devices)} {span}" if job.devices else span
    return f"{job.gpus_per_node}x{job.nodes}" if job.nodes > 1 else str(job.gpus_per_node)


class JobsTable(MeshTable):
    view_name = "jobs"
    COLUMNS = (
        Column("job", "Job", 8),
        Column("state", "State", 9),
        Column("node", "Node", 12, grow=8),
        Column("gpus", "GPU", 4, right=True),
        Column("progress", "Done", 4, right=True),
        Column("starts", "Start", 5, right=True),
        Column("ends", "End", 5, right=True),
        Column("why", "Command / why", 12, stretch=True),
    )
    SORTS: ClassVar[Mapping[str, SortSpec]] = {
        "name": (lambda r: r.job.job_id, False),
        "util": (lambda r: _nz(r.job.progress), True),
        "mem": (lambda r: r.job.gpus_per_node * r.job.nodes, True),
        "temp": (lambda r: _inf(r.times.ends_in_s), False),
    }
    """For jobs: N by id, U by progress, M by GPUs asked, T by predicted completion."""

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        scope = ctx.scope
        snapshot = ctx.snapshot
        jobs: Iterable[JobView] = snapshot.jobs
        if scope.node_id is not None:
            jobs = snapshot.jobs_on(scope.node_id, scope.device_key)
        for j in jobs:
            yield j.job_id, JobRow(j, snapshot.times(j))

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        j: JobView = item.job
        snapshot = ctx.snapshot
        hosts = " ".join(snapshot.hostname(node) for node, _ in j.placed())
        why = snapshot.why_waiting(j) or ""
        return f"{j.job_id} {j.state} {j.kind} {hosts} {j.command} {why}"

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        j: JobView = item.job
        times: JobTimes = item.times
        p = ctx.palette
        snapshot = ctx.snapshot
        why: Part
        waiting = snapshot.why_waiting(j)
        if waiting:
            why = (waiting, p.of("warn"))
        elif j.state == "failed" and j.exit_code is not None:
            why = (f"exit {j.exit_code}: {j.command}", p.of("bad"))
        else:
            why = (j.command, p.muted)
        return (
            (j.job_id[:8], None),
            (j.state, p.of(state_level(j.state))),
            (
                job_hosts(
                    j, snapshot, self._column_widths(self.scrollable_content_region.width)[2]
                ),
                None,
            ),
            (job_gpus(j), None),
            ("-" if j.progress is None else f"{100 * j.progress:.0f}%", None),
            (_soon(times.starts_in_s), None),
            (_soon(times.ends_in_s), None),
            why,
        )

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        job = snapshot.job(key)
        if job is None:
            return None
        return Selection("job", node_id=job.runner, job_id=key, raw=job.raw, title=key[:8])


def _inf(value: float | None) -> float:
    return float("inf") if value is None else value


class EventsTable(MeshTable):
    view_name = "events"
    COLUMNS = (
        Column("age", "Age", 5, right=True),
        Column("kind", "Kind", 10),
        Column("node", "Node", 14),
        Column("job", "Job", 8),
        Column("message", "Message", 30, stretch=True),
    )
    SORTS: ClassVar[Mapping[str, SortSpec]] = {"name": (lambda e: e.seq, True)}
    MAX_EVENTS: ClassVar[int] = 2000

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        node_id = ctx.scope.node_id
        for e in reversed(ctx.snapshot.events[-self.MAX_EVENTS :]):
            if node_id is None or e.node == node_id:
                yield str(e.seq), e

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        e: EventView = item
        node = ctx.snapshot.hostname(e.node) if e.node else "-"
        return f"{e.kind} {node} {e.job_id or ''} {e.message}"

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        e: EventView = item
        snapshot = ctx.snapshot
        return (
            (duration(snapshot.taken_at - e.at), None),
            (e.kind, None),
            (snapshot.hostname(e.node) if e.node else "-", None),
            ((e.job_id or "-")[:8], None),
            (e.message, None),
        )

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        event = next((e for e in snapshot.events if str(e.seq) == key), None)
        if event is None:
            return None
        raw = {
            "seq": event.seq,
            "at": event.at,
            "kind": event.kind,
            "node": event.node,
            "job_id": event.job_id,
            "message": event.message,
        }
        if event.job_id is not None and snapshot.job(event.job_id) is not None:
            return Selection("job", node_id=event.node, job_id=event.job_id, raw=raw, title="event")
        if event.node is not None and snapshot.host(event.node) is not None:
            return Selection("host", node_id=event.node, raw=raw, title="event")
        return Selection("event", raw=raw, title=f"event {event.seq}")
