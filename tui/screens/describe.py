"""Describe a row (``d``) or show its raw JSON (``y``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from rich.console import RenderableType
from rich.json import JSON
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from agent.cli.tables import job_hints
from tui.model import JobView, MeshSnapshot
from tui.widgets.base import Selection
from tui.widgets.render import bandwidth, duration, gib, mem_pair, pct, temp, watts


def _total(value_bytes: int | None) -> str:
    return "N/A" if value_bytes is None else f"{gib(value_bytes)} GiB"


def _kv(rows: list[tuple[str, Any]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        shown = value if isinstance(value, Table) else "N/A" if value is None else str(value)
        table.add_row(key, shown)
    return table


def _when(forecast_s: float | None, p90_s: float | None, verb: str) -> str:
    """``in 12m (p50), 20m (p90)``; ``now``; ``-`` when not predicted."""
    if forecast_s is None:
        return "-"
    if forecast_s < 1:
        return verb
    tail = f", {duration(p90_s)} (p90)" if p90_s is not None and p90_s >= forecast_s else ""
    return f"in {duration(forecast_s)} (p50){tail}"


def describe_job(job: JobView, snapshot: MeshSnapshot) -> RenderableType:
    """A job: what it runs and asks for, where it runs (every member of a gang, by rank), when
    it should start and end, and why it waits."""
    r = job.spec.get("resources") or {}
    times = snapshot.times(job)
    f = times.forecast
    now = snapshot.taken_at
    p90_start = None if f is None else f.start_p90 - now
    p90_end = None if f is None else f.end_p90 - now
    if f is not None and times.ends_in_s != f.end_p50 - now:
        p90_end = None  # the job's own estimate: no p90 to go with it
    rows: list[tuple[str, Any]] = [
        ("job", job.job_id),
        ("state", job.state + (f" (attempt {job.attempt})" if job.attempt > 1 else "")),
        ("command", job.command),
        ("kind / priority", f"{job.kind} / {job.priority}"),
        (
            "resources",
            f"{r.get('gpus_per_node')}"
            + (f"-{r['gpus_max_per_node']} (elastic)" if r.get("gpus_max_per_node") else "")
            + f" GPU(s) x {job.nodes} node(s)"
            + (f", backends {'/'.join(r['backends'])}" if r.get("backends") else ""),
        ),
        ("owner", snapshot.hostname(job.owner)),
    ]
    if job.members:
        rows.append(("members", _members(job, snapshot)))
    else:
        rows.append(("runner", snapshot.hostname(job.runner) if job.runner else "-"))
        rows.append(("devices", ", ".join(job.devices) or "-"))
    rows.append(("progress", "-" if job.progress is None else f"{100 * job.progress:.0f}%"))
    if job.state == "pending":
        rows.append(("predicted start", _when(times.starts_in_s, p90_start, "now")))
    if job.live:
        rows.append(("predicted end", _when(times.ends_in_s, p90_end, "now")))
    rows.append(("exit code", job.exit_code))
    waiting = snapshot.why_waiting(job)
    if waiting:
        rows.append(("why pending", waiting))
    elif job.reason:
        rows.append(("reason", job.reason))
    if job.spec.get("datasets"):
        rows.append(("datasets", ", ".join(job.spec["datasets"])))
    told = job_hints([dataclasses.asdict(e) for e in snapshot.events], job.job_id)
    rows += [("hints" if i == 0 else "", h["message"]) for i, h in enumerate(told)]
    return _kv(rows)


def _members(job: JobView, snapshot: MeshSnapshot) -> Table:
    """A gang's members, one line each: rank, host and the devices it holds there."""
    table = Table.grid(padding=(0, 2))
    table.add_column(justify="right", no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    for m in job.members:
        gpus = ", ".join(k.rsplit(":", 1)[-1] for k in m.devices) or "-"
        table.add_row(f"rank {m.rank}", snapshot.hostname(m.node), f"GPUs {gpus}")
    return table


def describe(selection: Selection, snapshot: MeshSnapshot) -> RenderableType:
    """A readable account of what is selected: a host, a GPU or a job."""
    if selection.kind == "job" and selection.job_id is not None:
        job = snapshot.job(selection.job_id)
        return Text("that job is gone") if job is None else describe_job(job, snapshot)
    host = snapshot.host(selection.node_id)
    if host is None:
        return JSON(json.dumps(selection.raw or {}, default=str))
    if selection.kind == "gpu":
        d = next((x for x in host.devices if x.key == selection.device_key), None)
        if d is None:
            return Text("that GPU is gone")
        links = ", ".join(f"{lk.kind} {bandwidth(lk.bandwidth_mbps)}" for lk in d.links[:4])
        jobs = snapshot.jobs_on(host.node_id, d.key)
        return _kv(
            [
                ("GPU", f"{d.index} on {host.hostname}"),
                ("model", d.name),
                ("vendor / backend", f"{d.vendor} / {d.backend}"),
                ("arch", d.arch),
                ("uuid", d.uuid),
                ("PCI", d.pci_bus_id),
                ("utilization", pct(d.util_pct)),
                ("memory", mem_pair(d.mem_used_bytes, d.mem_total_bytes)),
                ("temperature", f"{temp(d.temp_c)} (slows down at {temp(d.slowdown_c)})"),
                ("power", watts(d.power_mw, d.power_limit_mw)),
                ("links", links or "-"),
                ("jobs", ", ".join(j.job_id[:8] for j in jobs) or "idle"),
            ]
        )
    rows = [
        ("host", host.hostname),
        ("node id", host.node_id),
        ("address", host.addr),
        ("state", host.state + (" (stale)" if host.stale else "")),
        ("drain", host.drain),
        ("telemetry age", duration(host.telemetry_age_s)),
        ("os / arch", f"{host.os} / {host.arch}"),
        ("CPUs / memory", f"{host.cpu_count or 'N/A'} / {_total(host.mem_total_bytes)}"),
        ("labels", ", ".join(f"{k}={v}" for k, v in host.labels.items()) or "-"),
        ("GPUs", ", ".join(sorted({d.short_name for d in host.devices})) or "none"),
        ("running jobs", ", ".join(j[:8] for j in host.running_jobs) or "none"),
        ("queue", host.queue),
    ]
    return _kv(rows)


class DescribeScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "dismiss", "Close", id="dialog.close"),
    ]

    def __init__(self, title: str, body: RenderableType) -> None:
        super().__init__()
        self.title_text = title
        self.body = body

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog wide", id="describe"):
            yield Label(self.title_text, classes="title")
            yield Static(self.body, id="describe-body")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)


def json_body(raw: Mapping[str, Any] | None) -> RenderableType:
    return JSON(json.dumps(raw or {}, default=str, sort_keys=True), indent=2)
